"""Settings of the preference algorithms (no torch import here), registered in :data:`ALGORITHMS` by
:mod:`.algorithm_settings`:

- offline, from preference pairs on disk (the learner alone, like SFT): ``rm`` (reward-model training,
  Bradley-Terry) and ``dpo`` (DPO against a frozen reference, or reference log-probabilities in the data);
- online, through the fleet (rollout -> ``/score`` -> queue, exactly as GRPO): ``rejection_sampling`` (each
  group's best sample above ``threshold`` is SFT data for the step; OpenRLHF's best-of-n) and ``online_dpo``
  (each group's best and worst sample, when their scores differ by ``min_gap`` or more, form a DPO pair).

``runs_fleet`` (class attribute) says whether a run of the algorithm starts the rollout and reward fleets;
``data_kind`` what its rows hold (``prompts``, ``answers`` or ``pairs``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.learner.algorithms.correction_settings import CorrectionSettings, NoCorrection
from services.learner.algorithms.dynamic_sampling_settings import DynamicSamplingSettings

DPOLossKind = Literal["sigmoid", "ipo"]


class _DPOFields(BaseModel):
    beta: float = Field(default=0.1, gt=0.0, le=100.0, description="DPO's beta: how far the policy may move from the "
                        "reference (higher: closer to it).")
    loss: DPOLossKind = Field(default="sigmoid", description="sigmoid (DPO; with label_smoothing: conservative DPO, "
                              "cDPO) or ipo (squared loss towards a log-ratio gap of 1/(2 beta)).")
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=0.5, description="cDPO: the probability that a pair's "
                                   "preference is flipped (loss sigmoid only); 0 is plain DPO.")
    sft_coef: float = Field(default=0.0, ge=0.0, description="Adds coef x the chosen side's NLL (per token) to the "
                            "loss (RPO); 0 turns it off.")

    @model_validator(mode="after")
    def _smoothing_needs_sigmoid(self):
        if self.label_smoothing and self.loss != "sigmoid":
            raise ValueError("algorithm.label_smoothing is cDPO, a variant of loss sigmoid: set loss: sigmoid or "
                             "label_smoothing: 0")
        return self


class OfflinePreferenceSettings(BaseModel):
    """What the offline preference runs share: batches of pairs from ``data.path``, held-out pairs from
    ``data.eval_path``."""

    model_config = ConfigDict(extra="forbid")
    runs_fleet: ClassVar[bool] = False
    data_parallel: ClassVar[bool] = False  # one rank
    data_kind: ClassVar[str] = "pairs"

    epochs: int = Field(default=1, ge=1, description="Passes over the pairs (data.epochs means the same).")
    batch_size: int = Field(default=16, ge=1, description="Pairs per optimizer step.")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many steps (train.max_steps "
                                  "means the same).")
    eval_every: int | None = Field(default=None, ge=1, description="Measure held-out pairwise accuracy "
                                   "(data.eval_path) every N steps, besides before the first and after the last.")
    eval_max_pairs: int | None = Field(default=None, ge=1, description="Use only the first N held-out pairs.")


class RMSettings(OfflinePreferenceSettings):
    """Reward-model training: a causal LM's trunk + a scalar head (a sequence-classification model) trained
    with the Bradley-Terry pairwise loss; the export is what the reward service's hf_rm scorer loads."""

    name: Literal["rm"] = "rm"
    margin_key: str | None = Field(default=None, description="Row field with a per-pair margin subtracted from the "
                                   "reward gap (Llama 2's margin loss); unset: no margin.")
    normalize_reward: bool = Field(default=False, description="At the end, write the mean / std of the rewards of "
                                   "the training pairs' both sides into config.json (OpenRLHF's normalize_reward): "
                                   "the hf_rm scorer then serves (r - mean) / std.")
    normalize_max_pairs: int = Field(default=2048, ge=1, description="Pairs the normalize_reward statistics are "
                                     "computed on (the first N training rows).")
    append_eos: bool = Field(default=True, description="Each side's text ends with one eos token, as the hf_rm "
                             "scorer's append_eos (default true) serves it; keep the two the same.")
    max_length: int = Field(default=2048, ge=8, description="Tokens kept per side (the end is kept, as the hf_rm "
                            "scorer keeps it).")


class DPOSettings(_DPOFields, OfflinePreferenceSettings):
    """Offline DPO from preference pairs, against the frozen reference (model.reference, default the starting
    policy), or reference log-probabilities the rows carry (ref_chosen_key / ref_rejected_key)."""

    name: Literal["dpo"] = "dpo"
    ref_chosen_key: str | None = Field(default=None, description="Row field with the reference's summed "
                                       "log-probability of the chosen response (precomputed: no reference model "
                                       "is loaded); set with ref_rejected_key.")
    ref_rejected_key: str | None = Field(default=None, description="Row field with the reference's summed "
                                         "log-probability of the rejected response.")

    @model_validator(mode="after")
    def _both_ref_keys(self) -> DPOSettings:
        if (self.ref_chosen_key is None) != (self.ref_rejected_key is None):
            raise ValueError("algorithm.ref_chosen_key and algorithm.ref_rejected_key: set both (precomputed reference "
                             "log-probabilities) or neither (the reference model computes them)")
        return self


class _OnlineBase(BaseModel):
    """Online preference algorithms consume complete groups from the queue like GRPO (staleness bound, grants,
    dynamic sampling, resume). Of the RL fields they keep ``dynamic_sampling`` (drop groups whose scores are all
    equal: they hold no best and worst) and ``correction`` (none: these losses read no engine log-probabilities)."""

    model_config = ConfigDict(extra="forbid")
    runs_fleet: ClassVar[bool] = True
    data_parallel: ClassVar[bool] = False  # one rank (the RL trainer alone shards a step)
    data_kind: ClassVar[str] = "prompts"

    correction: CorrectionSettings = Field(default_factory=NoCorrection, description="Off-policy correction: unused "
                                           "by the preference algorithms (keep none).")
    dynamic_sampling: DynamicSamplingSettings = Field(
        default_factory=DynamicSamplingSettings, description="Drop groups whose scores are all equal (they hold no "
        "pair and no best sample above the others) and refill the batch (DAPO).")


class RejectionSamplingSettings(_OnlineBase):
    """Best-of-n through the fleet (OpenRLHF's rejection sampling): from each complete group, its best-scored
    sample, if its score is at least ``threshold``, is an SFT pair of the step; the rest of the group is dropped."""

    name: Literal["rejection_sampling"] = "rejection_sampling"
    threshold: float = Field(default=0.5, description="Smallest score a group's best sample needs to be trained on.")
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        default="token-mean", description="How per-token NLL is reduced.")


class OnlineDPOSettings(_DPOFields, _OnlineBase):
    """Iterative / online DPO through the fleet: from each complete group, the best- and worst-scored samples
    form a pair when their scores differ by ``min_gap`` or more; a step trains DPO on the pairs of its groups,
    against the frozen reference (model.reference, default the starting policy)."""

    name: Literal["online_dpo"] = "online_dpo"
    min_gap: float = Field(default=0.5, gt=0.0, description="Smallest score gap between a group's best and worst "
                           "sample that makes them a pair; groups with a smaller gap are not trained.")
