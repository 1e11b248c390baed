"""Typed algorithm settings: a discriminated union on ``name`` (no torch import here).

``AlgorithmSettings`` is the union the learner settings embed; :mod:`.registry` maps each ``name`` to
the class that computes advantages. Defaults follow OpenRLHF / the papers unless noted.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


class KLSettings(BaseModel):
    """KL to the frozen reference model."""

    model_config = ConfigDict(extra="forbid")

    coef: float = Field(default=0.0, ge=0.0, description="KL coefficient; 0 turns KL off (and skips the reference model).")
    estimator: Literal["k1", "k2", "k3"] = Field(default="k1", description="Per-token KL estimator (Schulman).")
    placement: Literal["reward", "loss"] = Field(
        default="reward", description="'reward': -coef*KL added to token rewards; 'loss': coef*KL added to the actor loss."
    )


class _RLAlgorithm(BaseModel):
    """Fields every policy-gradient algorithm has."""

    model_config = ConfigDict(extra="forbid")

    kl: KLSettings = Field(default_factory=KLSettings, description="KL penalty / loss to the reference policy.")
    eps_low: float = Field(default=0.2, gt=0.0, lt=1.0, description="Lower clip range: ratio >= 1 - eps_low.")
    eps_high: float = Field(default=0.2, gt=0.0, description="Upper clip range: ratio <= 1 + eps_high (clip-higher: 0.28).")
    dual_clip: float | None = Field(default=None, gt=1.0, description="Dual-clip constant c > 1 for negative advantages.")
    entropy_coef: float = Field(default=0.0, ge=0.0, description="Entropy bonus coefficient (loss -= coef * entropy).")
    loss_agg: LossAggregation = Field(default="token-mean", description="How per-token losses are reduced.")
    tis_cap: float | None = Field(
        default=2.0, gt=0.0, description="Truncated IS cap C for min(exp(old_lp - engine_lp), C); null disables TIS."
    )
    normalize_rewards: bool = Field(default=False, description="Normalise scalar rewards by running mean / std.")
    reward_clip: float | None = Field(default=None, gt=0.0, description="Clip rewards to [-c, c] after normalisation.")
    normalize_advantages: bool = Field(default=False, description="Whiten advantages over the batch's action tokens.")
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="Discount over response tokens.")
    ppo_epochs: int = Field(default=1, ge=1, le=64, description="Passes of updates over each batch.")


class PPOSettings(_RLAlgorithm):
    """PPO with a separate critic and GAE."""

    name: Literal["ppo"] = "ppo"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.01, estimator="k1", placement="reward"))
    lambd: float = Field(default=0.95, ge=0.0, le=1.0, description="GAE lambda.")
    value_clip: float | None = Field(default=0.2, gt=0.0, description="Value clipping range; null disables.")
    normalize_advantages: bool = True


class GRPOSettings(_RLAlgorithm):
    """GRPO: group-normalised advantages, no critic."""

    name: Literal["grpo"] = "grpo"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.0, estimator="k3", placement="loss"))
    norm_std: bool = Field(default=True, description="Divide by the group std (false: Dr. GRPO, mean-centring only).")
    std_eps: float = Field(default=1e-6, gt=0.0, description="Added to the group std.")


class ReinforcePPSettings(_RLAlgorithm):
    """REINFORCE++: token-level KL penalty in the reward, returns whitened over the global batch."""

    name: Literal["reinforce_pp"] = "reinforce_pp"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.01, estimator="k1", placement="reward"))
    normalize_advantages: bool = True


class RLOOSettings(_RLAlgorithm):
    """RLOO: leave-one-out group baseline."""

    name: Literal["rloo"] = "rloo"
    kl: KLSettings = Field(default_factory=lambda: KLSettings(coef=0.01, estimator="k1", placement="reward"))


class SFTSettings(BaseModel):
    """Supervised fine-tuning on prompt / answer pairs, loss on the answer tokens only."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["sft"] = "sft"
    epochs: int = Field(default=1, ge=1, description="Passes over the dataset.")
    batch_size: int = Field(default=8, ge=1, description="Pairs per optimizer step.")
    loss_agg: LossAggregation = Field(default="token-mean", description="How per-token losses are reduced.")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many steps.")


AlgorithmSettings = Annotated[
    PPOSettings | GRPOSettings | ReinforcePPSettings | RLOOSettings | SFTSettings, Field(discriminator="name")
]
