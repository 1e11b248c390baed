"""Typed settings of the policy loss (``algorithm.policy_loss``), torch-free, and the policy-loss plug-in point
(:data:`POLICY_LOSSES`): each ``kind`` maps to its settings class and its function in :mod:`.policy_losses`,
called ``fn(inputs, **fields)`` with the settings' fields. A loss that needs a particular reduction names it
(``aggregation``); otherwise ``algorithm.loss_agg`` applies.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.plugins import IN_SETTINGS, PluginPoint

LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


class PolicyLossSettingsBase(BaseModel):
    """What every policy loss's settings are (subclass it for your own loss; override ``aggregation`` for a
    loss defined with its own reduction)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def aggregation(self) -> LossAggregation | None:
        """The reduction this loss is defined with (None: ``algorithm.loss_agg``)."""
        return None


class PPOClipLoss(PolicyLossSettingsBase):
    """PPO's clipped surrogate with separate low / high ranges (DAPO clip-higher) and optional dual clip."""

    kind: Literal["ppo"] = "ppo"
    eps_low: float = Field(default=0.2, gt=0.0, lt=1.0, description="Lower clip range: ratio >= 1 - eps_low.")
    eps_high: float = Field(default=0.2, gt=0.0, description="Upper clip range: ratio <= 1 + eps_high (clip-higher: 0.28).")
    dual_clip: float | None = Field(default=None, gt=1.0, description="Dual-clip constant c > 1 for negative advantages.")


class DrGRPOLoss(PolicyLossSettingsBase):
    """Dr. GRPO (Liu et al. 2025): the clipped surrogate, summed over each sequence's tokens and divided by a
    constant (the generation budget) instead of the sequence length: no length bias. Pair with
    ``algorithm.norm_std: false`` (no std normalisation of group advantages); the settings check it."""

    kind: Literal["dr_grpo"] = "dr_grpo"
    eps_low: float = Field(default=0.2, gt=0.0, lt=1.0, description="Lower clip range.")
    eps_high: float = Field(default=0.2, gt=0.0, description="Upper clip range.")
    normalizer: int = Field(default=1024, ge=1, description="The constant each sequence's token sum is divided by "
                                                             "(use the generation budget, max_new_tokens).")

    @property
    def aggregation(self) -> LossAggregation:
        return "seq-mean-token-sum"


class GSPOLoss(PolicyLossSettingsBase):
    """GSPO (Zheng et al. 2025): one length-normalised importance ratio per sequence, clipped per sequence
    (ranges of order 1e-4), applied to every token; reduced per sequence then averaged."""

    kind: Literal["gspo"] = "gspo"
    eps_low: float = Field(default=3e-4, gt=0.0, lt=1.0, description="Lower clip range of the sequence ratio.")
    eps_high: float = Field(default=4e-4, gt=0.0, description="Upper clip range of the sequence ratio.")

    @property
    def aggregation(self) -> LossAggregation:
        return "seq-mean-token-mean"


class CISPOLoss(PolicyLossSettingsBase):
    """CISPO (MiniMax-M1): REINFORCE with a clipped, stop-gradient IS weight, so no token's gradient is
    dropped by clipping: ``-sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * log pi``."""

    kind: Literal["cispo"] = "cispo"
    eps_low: float = Field(default=1.0, gt=0.0, le=1.0, description="Lower clip of the weight (1.0: none).")
    eps_high: float = Field(default=0.28, gt=0.0, description="Upper clip of the weight.")


class DPPOLoss(PolicyLossSettingsBase):
    """DPPO-style masked ratio (the binary trust region prime-rl uses): a token whose probability already
    moved more than ``delta_high`` up (positive advantage) or ``delta_low`` down (negative advantage) since
    sampling gets no gradient; the others ``-A * ratio`` unclipped."""

    kind: Literal["dppo"] = "dppo"
    delta_low: float = Field(default=0.2, gt=0.0, le=1.0, description="Largest probability drop still trained.")
    delta_high: float = Field(default=0.2, gt=0.0, le=1.0, description="Largest probability rise still trained.")


class CustomLoss(PolicyLossSettingsBase):
    """Your own loss, by import path: ``fn(inputs: PolicyLossInputs, **kwargs) -> PolicyLossOutput``."""

    kind: Literal["custom"] = "custom"
    path: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description="`package.module:function`.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for every call.")
    agg: LossAggregation | None = Field(default=None, description="Reduction the loss is defined with "
                                                                  "(default: algorithm.loss_agg).")

    @property
    def aggregation(self) -> LossAggregation | None:
        return self.agg


#: policy losses by ``kind``: settings model -> ``fn(inputs: PolicyLossInputs, **fields) -> PolicyLossOutput``
#: (import paths: torch loads only in the learner). ``custom`` names its function in its settings; register
#: your own with ``POLICY_LOSSES.register("mine", MyLossSettings, "package.module:my_loss")`` (docs/plugins.md).
POLICY_LOSSES: PluginPoint[Any] = PluginPoint(
    "policy loss", where="learner: algorithm.policy_loss.kind", doc="Policy losses "
    "(services/learner/algorithms/policy_losses.py).", settings_base=PolicyLossSettingsBase,
    base="services.learner.algorithms.policy_losses:PolicyLoss")
POLICY_LOSSES.register("ppo", PPOClipLoss, "services.learner.algorithms.policy_losses:ppo_loss")
POLICY_LOSSES.register("dr_grpo", DrGRPOLoss, "services.learner.algorithms.policy_losses:dr_grpo_loss")
POLICY_LOSSES.register("gspo", GSPOLoss, "services.learner.algorithms.policy_losses:gspo_loss")
POLICY_LOSSES.register("cispo", CISPOLoss, "services.learner.algorithms.policy_losses:cispo_loss")
POLICY_LOSSES.register("dppo", DPPOLoss, "services.learner.algorithms.policy_losses:dppo_loss")
POLICY_LOSSES.register("custom", CustomLoss, IN_SETTINGS)

#: a settings field holding one policy loss's settings
PolicyLossSettings = POLICY_LOSSES.settings_type("PolicyLossSettings")
