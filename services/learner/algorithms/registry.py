"""RL algorithms by name: each turns scores (+ KL, + values) into per-token advantages and returns.

``build_algorithm(settings)`` looks the class up in :data:`ALGORITHMS` by ``settings.name``. Adding an
algorithm is a new class with ``@register("name")`` and a settings class in :mod:`.config`.

All four place the (shaped) scalar reward on the last action token and, with KL placement
``reward``, add ``-coef * KL`` to every token's reward (OpenRLHF ``compute_reward``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from services.learner.algorithms.advantages import (
    discounted_returns,
    end_token_rewards,
    gae,
    group_advantages,
    rloo_advantages,
)
from services.learner.algorithms.config import (
    GRPOSettings,
    PPOSettings,
    ReinforcePPSettings,
    RLOOSettings,
    _RLAlgorithm,
)
from services.learner.algorithms.masked import masked_whiten


@dataclass(frozen=True)
class AdvantageInputs:
    scores: torch.Tensor  # [B] scalar rewards (already normalised if configured)
    groups: torch.Tensor  # [B] integer group labels
    mask: torch.Tensor  # [B, T] action mask
    kl: torch.Tensor  # [B, T] per-token KL estimate of the behaviour policy vs the reference (0 if off)
    values: torch.Tensor | None = None  # [B, T] critic values (PPO)
    whiten: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = masked_whiten  # batch-global on N ranks


class Algorithm:
    """Base: KL placement and the reward-to-go family's common steps."""

    name: ClassVar[str]
    needs_critic: ClassVar[bool] = False

    def __init__(self, settings: _RLAlgorithm) -> None:
        self.settings = settings

    @property
    def kl_reward_coef(self) -> float:
        return self.settings.kl.coef if self.settings.kl.placement == "reward" else 0.0

    @property
    def kl_loss_coef(self) -> float:
        return self.settings.kl.coef if self.settings.kl.placement == "loss" else 0.0

    @property
    def needs_reference(self) -> bool:
        return self.settings.kl.coef > 0

    def shape_scores(self, scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        """Turn raw scalar rewards into the scalar credited at the end token (baselines go here)."""
        return scores

    def token_rewards(self, inputs: AdvantageInputs) -> torch.Tensor:
        shaped = self.shape_scores(inputs.scores, inputs.groups)
        return end_token_rewards(shaped, inputs.mask) - self.kl_reward_coef * inputs.kl * inputs.mask

    def advantages(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantages, returns)``, both ``[B, T]``, 0 on masked positions."""
        returns = discounted_returns(self.token_rewards(inputs), inputs.mask, self.settings.gamma)
        advantages = returns
        if self.settings.normalize_advantages:
            advantages = inputs.whiten(advantages, inputs.mask)
        return advantages, returns


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return deco


@register("ppo")
class PPO(Algorithm):
    """GAE over token rewards with the critic's values."""

    needs_critic = True
    settings: PPOSettings

    def advantages(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
        if inputs.values is None:
            raise ValueError("PPO needs critic values")
        adv, returns = gae(self.token_rewards(inputs), inputs.values, inputs.mask, self.settings.gamma,
                           self.settings.lambd)
        if self.settings.normalize_advantages:
            adv = inputs.whiten(adv, inputs.mask)
        return adv, returns


@register("grpo")
class GRPO(Algorithm):
    settings: GRPOSettings

    def shape_scores(self, scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return group_advantages(scores, groups, norm_std=self.settings.norm_std, eps=self.settings.std_eps)


@register("reinforce_pp")
class ReinforcePP(Algorithm):
    """Raw rewards, token KL in the reward, global whitening of the returns (``normalize_advantages``)."""

    settings: ReinforcePPSettings


@register("rloo")
class RLOO(Algorithm):
    settings: RLOOSettings

    def shape_scores(self, scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return rloo_advantages(scores, groups)


def build_algorithm(settings: _RLAlgorithm) -> Algorithm:
    """The algorithm object for ``settings`` (looked up by ``settings.name``)."""
    name = getattr(settings, "name", None)
    if name not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {name!r}; known: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name](settings)
