"""The optimizer-backend seam: what every backend implements (the backends by name: :mod:`.factory`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from services.learner.settings import OptimSettings
from services.learner.training.backends.schedule import SCHEDULES, Schedule


class TrainEngine(ABC):
    """One trainable model with its optimizer and LR schedule."""

    model: nn.Module

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of ``loss`` (already scaled for accumulation by the caller)."""

    @abstractmethod
    def step(self) -> float:
        """Clip, apply the accumulated gradients, advance the schedule, zero grads. Returns the grad norm."""

    @abstractmethod
    def lr(self) -> float:
        """The current learning rate."""

    @abstractmethod
    def save_state(self, out_dir: Path) -> None:
        """Write optimizer + scheduler state under ``out_dir`` (our own files only)."""

    @abstractmethod
    def load_state(self, in_dir: Path) -> None:
        """Restore what :meth:`save_state` wrote."""

    @property
    def optimizer_steps(self) -> int:
        return 0

    @property
    def owns_parameter_memory(self) -> bool:
        """True where the backend lays parameters out itself (e.g. DeepSpeed's flat partitions), so nothing
        else may re-point them (see WeightPublisher.flatten)."""
        return False

    @property
    def sharded(self) -> bool:
        """True where ranks hold different parts of the model / optimizer (every rank saves its part)."""
        return False

    @property
    def partitions_parameters(self) -> bool:
        """True where no rank holds the full parameters between steps (ZeRO-3): reading them takes
        :meth:`gathered`."""
        return False

    @property
    def lockstep(self) -> bool:
        """True where every forward and backward is a collective (FSDP): every rank must run as many passes
        of each model (see :mod:`services.learner.training.lockstep`)."""
        return False

    def gathered(self, fn: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``fn()`` with the full parameters present; collective where the backend shards them (call on
        every rank; only rank 0's result is meaningful there)."""
        return fn()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The complete model weights on this rank (gathered where the backend shards them)."""
        return self.model.state_dict()


def make_schedule(optim: OptimSettings, total_steps: int) -> Schedule:
    """The LR multiplier per optimizer step: the schedule spans ``optim.total_steps`` when set, else the
    ``total_steps`` the runner worked out (from max_steps, or the data and epochs)."""
    span = optim.total_steps or total_steps
    warmup = int(optim.warmup_ratio * span)
    return SCHEDULES[optim.schedule](span, warmup, optim.min_lr_ratio)
