"""Algorithms by name, the implementations of the algorithm plug-in point (:data:`.config.ALGORITHMS`).

Every algorithm is a :class:`LearnerAlgorithm`: it names the **runner** that owns the run (the object the
learner service starts: ``runner(settings, redis, sink)`` with ``needs_redis``, ``async run(stop)``,
``status()``, ``phase``, ``error``, ``request_checkpoint()``; see ``services/learner/rl/runner.py``). The RL
ones are :class:`Algorithm` s run by the RL runner: each turns scores (+ KL, + values) into per-token
advantages and returns. ``build_algorithm(settings)`` builds the RL algorithm ``settings.name`` names;
``runner_class(settings)`` is the runner. Adding an algorithm: a settings class (subclass
``RLAlgorithmSettings`` for an RL one), a class here or in your own module, and
``ALGORITHMS.register(name, settings, cls)`` (docs/plugins.md).

All four place the (shaped) scalar reward on the last action token and, with KL placement
``reward``, add ``-coef * KL`` to every token's reward (OpenRLHF ``compute_reward``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from services.learner.algorithms.advantages import (
    discounted_returns,
    end_token_rewards,
    gae,
    group_advantages,
    rloo_advantages,
)
from services.learner.algorithms.algorithm_settings import (
    ALGORITHMS,
    GRPOSettings,
    PPOSettings,
    ReinforcePPSettings,
    RLAlgorithmSettings,
    RLOOSettings,
    SFTSettings,
)
from services.learner.algorithms.masked import masked_whiten
from services.learner.runner import Runner, runner_problem
from shared.service_kit.loader import LoadError, load_object


@dataclass(frozen=True)
class AdvantageInputs:
    scores: torch.Tensor  # [B] scalar rewards (already normalised if configured)
    groups: torch.Tensor  # [B] integer group labels
    mask: torch.Tensor  # [B, T] action mask
    kl: torch.Tensor  # [B, T] per-token KL estimate of the behaviour policy vs the reference (0 if off)
    values: torch.Tensor | None = None  # [B, T] critic values (PPO)
    whiten: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = masked_whiten  # batch-global on N ranks


class LearnerAlgorithm:
    """What every algorithm registers: built from its settings, it names the runner that owns the run."""

    name: ClassVar[str]
    #: the runner class (a :class:`~services.learner.runner.Runner`), or its import path (loaded and checked
    #: when the learner starts)
    runner: ClassVar[str | type] = "services.learner.rl.runner:RLRunner"
    #: the RL runner's trainer (what trains a step of complete groups), or its import path
    trainer: ClassVar[str | type] = "services.learner.training.rl_trainer:RLTrainer"

    def __init__(self, settings: Any) -> None:
        self.settings = settings


class Algorithm(LearnerAlgorithm):
    """Base of the RL algorithms: KL placement and the reward-to-go family's common steps."""

    needs_critic: ClassVar[bool] = False
    settings: RLAlgorithmSettings

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


class PPO(Algorithm):
    """GAE over token rewards with the critic's values."""

    name = "ppo"
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


class GRPO(Algorithm):
    name = "grpo"
    settings: GRPOSettings

    def shape_scores(self, scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return group_advantages(scores, groups, norm_std=self.settings.norm_std, eps=self.settings.std_eps)


class ReinforcePP(Algorithm):
    """Raw rewards, token KL in the reward, global whitening of the returns (``normalize_advantages``)."""

    name = "reinforce_pp"
    settings: ReinforcePPSettings


class RLOO(Algorithm):
    name = "rloo"
    settings: RLOOSettings

    def shape_scores(self, scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return rloo_advantages(scores, groups)


class SFT(LearnerAlgorithm):
    """Supervised fine-tuning: no advantages; its own runner."""

    name = "sft"
    runner = "services.learner.sft.runner:SFTRunner"
    settings: SFTSettings


def build_algorithm(settings: RLAlgorithmSettings) -> Algorithm:
    """The RL algorithm object for ``settings`` (looked up by ``settings.name``)."""
    name = getattr(settings, "name", None)
    if not isinstance(name, str) or name not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {name!r}; known: {ALGORITHMS.kinds()}")
    cls = ALGORITHMS.load(name)
    if not issubclass(cls, Algorithm):
        raise TypeError(f"algorithm {name!r} ({cls.__qualname__}) is not an RL algorithm (an Algorithm subclass)")
    return cls(settings)


def runner_class(settings: Any) -> type[Runner]:
    """The runner that owns a run of the algorithm ``settings.name`` names (what the learner service starts),
    checked against :class:`~services.learner.runner.Runner`; LoadError (one line) when it is not one."""
    name = settings.name
    runner = ALGORITHMS.load(name).runner
    if isinstance(runner, str):
        runner = load_object(runner, what=f"runner of algorithm {name!r}")
    problem = runner_problem(runner)
    if problem:
        raise LoadError(f"runner of algorithm {name!r}: {problem}")
    return runner


def trainer_class(settings: Any) -> type:
    """The trainer the RL runner builds for the algorithm ``settings.name`` names (``train_step(experiences)``)."""
    name = settings.name
    trainer = ALGORITHMS.load(name).trainer
    if isinstance(trainer, str):
        trainer = load_object(trainer, what=f"trainer of algorithm {name!r}")
    if not isinstance(trainer, type) or not callable(getattr(trainer, "train_step", None)):
        raise LoadError(f"trainer of algorithm {name!r}: {trainer!r} is not a trainer class (one with train_step)")
    return trainer
