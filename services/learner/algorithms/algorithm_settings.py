"""Typed algorithm settings, chosen by ``name`` (no torch import here), and the algorithm plug-in point
(:data:`ALGORITHMS`): each ``name`` maps to its settings class and to its class in :mod:`.rl_algorithms` (which
computes advantages and names the runner). Defaults follow OpenRLHF / the papers unless noted.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.learner.algorithms.correction_settings import CorrectionSettings, TISCorrection
from services.learner.algorithms.dynamic_sampling_settings import DynamicSamplingSettings
from services.learner.algorithms.length_shaping_settings import OverlongNone, OverlongSettings
from services.learner.algorithms.policy_loss_settings import LossAggregation, PolicyLossSettings, PPOClipLoss
from services.learner.algorithms.preference_settings import (
    DPOSettings,
    OnlineDPOSettings,
    RejectionSamplingSettings,
    RMSettings,
)
from shared.plugins import PluginPoint

__all__ = ["ALGORITHMS", "AlgorithmSettings", "DynamicSamplingSettings", "GRPOSettings", "KLSettings", "LossAggregation",
           "PPOSettings", "RLAlgorithmSettings", "RLOOSettings", "ReinforcePPSettings", "SFTSettings", "runs_fleet"]


class KLSettings(BaseModel):
    """KL to the frozen reference model."""

    model_config = ConfigDict(extra="forbid")

    coef: float = Field(default=0.0, ge=0.0, description="KL coefficient; 0 turns KL off (and skips the reference model).")
    estimator: Literal["k1", "k2", "k3"] = Field(default="k1", description="Per-token KL estimator (Schulman).")
    placement: Literal["reward", "loss"] = Field(
        default="reward", description="'reward': -coef*KL added to token rewards; 'loss': coef*KL added to the actor loss."
    )


class RLAlgorithmSettings(BaseModel):
    """Fields every policy-gradient algorithm has (subclass it for your own RL algorithm's settings)."""

    model_config = ConfigDict(extra="forbid")
    runs_fleet: ClassVar[bool] = True  # a run starts the rollout and reward fleets
    data_kind: ClassVar[str] = "prompts"  # what the rows hold: prompts (RL), answers (SFT), pairs (preferences)

    kl: KLSettings = Field(default_factory=KLSettings, description="KL penalty / loss to the reference policy.")
    policy_loss: PolicyLossSettings = Field(
        default_factory=PPOClipLoss, description="The policy loss, by kind: ppo (clipped, clip-higher, dual clip), "
        "dr_grpo, gspo, cispo, dppo, or custom by import path.")
    correction: CorrectionSettings = Field(
        default_factory=lambda: TISCorrection(cap=2.0), description="Off-policy correction between the engine's and "
        "the learner's log-probabilities, by kind: tis, mis, geo_seq, icepop, none.")
    overlong: OverlongSettings = Field(
        default_factory=OverlongNone, description="Samples cut by the length limit, by kind: none, mask (leave the "
        "loss), soft_penalty (DAPO's length penalty added to the reward).")
    dynamic_sampling: DynamicSamplingSettings = Field(
        default_factory=DynamicSamplingSettings, description="Drop zero-variance groups and refill the batch (DAPO).")
    entropy_coef: float = Field(default=0.0, ge=0.0, description="Entropy bonus coefficient (loss -= coef * entropy).")
    loss_agg: LossAggregation = Field(default="token-mean", description="How per-token losses are reduced (a loss "
                                                                       "defined with its own reduction overrides it).")
    normalize_rewards: bool = Field(default=False, description="Normalise scalar rewards by running mean / std.")
    reward_clip: float | None = Field(default=None, gt=0.0, description="Clip rewards to [-c, c] after normalisation.")
    normalize_advantages: bool = Field(default=False, description="Whiten advantages over the batch's action tokens.")
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount over response tokens.")
    ppo_epochs: int = Field(default=1, ge=1, le=64, description="Passes of updates over each batch.")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """Keys of earlier releases keep working (with a FutureWarning naming the new place): ``eps_low``,
        ``eps_high``, ``dual_clip`` -> ``policy_loss`` (kind ppo); ``tis_cap`` -> ``correction`` (kind tis,
        or none for null)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        clip = {k: data.pop(k) for k in ("eps_low", "eps_high", "dual_clip") if k in data}
        if clip:
            if "policy_loss" in data:
                raise ValueError(f"{sorted(clip)} and policy_loss are both set: put them in policy_loss")
            warnings.warn(f"algorithm.{', algorithm.'.join(sorted(clip))} moved: write policy_loss: "
                          f"{{kind: ppo, {', '.join(f'{k}: {v}' for k, v in clip.items())}}}", FutureWarning,
                          stacklevel=2)
            data["policy_loss"] = {"kind": "ppo", **clip}
        if "tis_cap" in data:
            cap = data.pop("tis_cap")
            if "correction" in data:
                raise ValueError("tis_cap and correction are both set: put the cap in correction (kind: tis)")
            new = {"kind": "none"} if cap is None else {"kind": "tis", "cap": cap}
            warnings.warn(f"algorithm.tis_cap moved: write correction: {new}", FutureWarning, stacklevel=2)
            data["correction"] = new
        return data


class PPOSettings(RLAlgorithmSettings):
    """PPO with a separate critic and GAE."""

    name: Literal["ppo"] = "ppo"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.01, estimator="k1", placement="reward"))
    lambd: float = Field(default=0.95, ge=0.0, le=1.0, description="GAE lambda.")
    value_clip: float | None = Field(default=0.2, gt=0.0, description="Value clipping range; null disables.")
    normalize_advantages: bool = Field(default=True, description="Whiten advantages over the batch's action tokens.")


class GRPOSettings(RLAlgorithmSettings):
    """GRPO: group-normalised advantages, no critic."""

    name: Literal["grpo"] = "grpo"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.0, estimator="k3", placement="loss"))
    norm_std: bool = Field(default=True, description="Divide by the group std (false: Dr. GRPO, mean-centring only).")
    std_eps: float = Field(default=1e-6, gt=0.0, description="Added to the group std.")

    @model_validator(mode="after")
    def _dr_grpo(self) -> GRPOSettings:
        if self.policy_loss.kind == "dr_grpo" and self.norm_std:
            raise ValueError("policy_loss dr_grpo removes GRPO's std normalisation: set algorithm.norm_std: false")
        return self


class ReinforcePPSettings(RLAlgorithmSettings):
    """REINFORCE++: token-level KL penalty in the reward, returns whitened over the global batch."""

    name: Literal["reinforce_pp"] = "reinforce_pp"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.01, estimator="k1", placement="reward"))
    normalize_advantages: bool = Field(default=True, description="Whiten advantages over the batch's action tokens.")


class RLOOSettings(RLAlgorithmSettings):
    """RLOO: leave-one-out group baseline."""

    name: Literal["rloo"] = "rloo"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.01, estimator="k1", placement="reward"))


class SFTSettings(BaseModel):
    """Supervised fine-tuning on prompt / answer pairs, loss on the answer tokens only."""

    model_config = ConfigDict(extra="forbid")
    runs_fleet: ClassVar[bool] = False
    data_kind: ClassVar[str] = "answers"

    name: Literal["sft"] = "sft"
    epochs: int = Field(default=1, ge=1, description="Passes over the dataset.")
    batch_size: int = Field(default=8, ge=1, description="Pairs per optimizer step.")
    loss_agg: LossAggregation = Field(default="token-mean", description="How per-token losses are reduced.")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many steps.")


#: algorithms by ``name``: settings model -> implementation, a ``LearnerAlgorithm`` subclass (import paths:
#: torch loads only when the learner builds it) that also names the runner owning the run (``runner``: RL
#: algorithms run in the RL loop, sft in the SFT loop). Register your own with
#: ``ALGORITHMS.register("mine", MySettings, "package.module:MyAlgorithm")`` (docs/plugins.md).
ALGORITHMS: PluginPoint[Any] = PluginPoint(
    "algorithm", where="learner: algorithm.name", doc="RL algorithms and SFT, each with the runner that owns the run "
    "(services/learner/algorithms/rl_algorithms.py).", tag="name",
    base="services.learner.algorithms.rl_algorithms:LearnerAlgorithm")
ALGORITHMS.register("ppo", PPOSettings, "services.learner.algorithms.rl_algorithms:PPO")
ALGORITHMS.register("grpo", GRPOSettings, "services.learner.algorithms.rl_algorithms:GRPO")
ALGORITHMS.register("reinforce_pp", ReinforcePPSettings, "services.learner.algorithms.rl_algorithms:ReinforcePP")
ALGORITHMS.register("rloo", RLOOSettings, "services.learner.algorithms.rl_algorithms:RLOO")
ALGORITHMS.register("sft", SFTSettings, "services.learner.algorithms.rl_algorithms:SFT")
ALGORITHMS.register("rm", RMSettings, "services.learner.algorithms.preference_algorithms:RewardModel")
ALGORITHMS.register("dpo", DPOSettings, "services.learner.algorithms.preference_algorithms:DPO")
ALGORITHMS.register("rejection_sampling", RejectionSamplingSettings,
                    "services.learner.algorithms.preference_algorithms:RejectionSampling")
ALGORITHMS.register("online_dpo", OnlineDPOSettings, "services.learner.algorithms.preference_algorithms:OnlineDPO")

#: a settings field holding one algorithm's settings (chosen by ``name``)
AlgorithmSettings = ALGORITHMS.settings_type("AlgorithmSettings")


def runs_fleet(settings: Any) -> bool:
    """Whether a run of ``settings`` (an algorithm's) starts the rollout and reward fleets; an algorithm settings
    class of a plug-in without ``runs_fleet`` is an RL one unless it is named sft."""
    return bool(getattr(settings, "runs_fleet", settings.name != "sft"))
