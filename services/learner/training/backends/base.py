"""The optimizer-backend seam: what every backend implements (the backends by name: :mod:`.factory`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import torch
from torch import nn

from services.learner.settings import OptimSettings
from services.learner.training.backends.schedule import SCHEDULES, Schedule

M = TypeVar("M", bound=nn.Module)


class TrainEngine(ABC, Generic[M]):
    """One trainable model with its optimizer and LR schedule (``TrainEngine[M]``: its ``model`` is an ``M``,
    the module it was built from: the backends wrap nothing around it)."""

    model: M

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate gradients of ``loss`` (already scaled for accumulation by the caller)."""

    @abstractmethod
    def step(self) -> float:
        """Clip, apply the accumulated gradients, advance the schedule, zero grads. Returns the grad norm."""

    @abstractmethod
    def lr(self) -> float:
        """The current learning rate."""

    def save_state(self, out_dir: Path) -> None:
        """Write optimizer + scheduler state under ``out_dir`` in the backend's own files: backends whose
        checkpoints are not DCP shards (:attr:`dcp_checkpoints` False; DeepSpeed) implement it."""
        raise NotImplementedError(f"{type(self).__name__} writes its checkpoints as DCP shards (sharded_state)")

    def load_state(self, in_dir: Path) -> None:
        """Restore what :meth:`save_state` wrote (an older full-state checkpoint, on the torch backend)."""
        raise NotImplementedError(f"{type(self).__name__} reads its checkpoints as DCP shards (sharded_state); "
                                  "an older full-state checkpoint resumes with backend torch")

    @property
    def optimizer_steps(self) -> int:
        return 0

    def set_optimizer_steps(self, steps: int) -> None:
        """Restore the step counter (a resumed checkpoint's); engines whose counter is the backend's own
        (DeepSpeed) restore it in :meth:`load_state`."""
        raise NotImplementedError(f"{type(self).__name__} restores its step count in load_state")

    @property
    def shards_parameters(self) -> bool:
        """True where ranks hold different parts of the parameters between steps (FSDP, ZeRO-3): reading the
        full weights takes :meth:`gathered` / :meth:`full_state_dict` (collective), and the final export is
        read from the run's last checkpoint instead."""
        return False

    @property
    def dcp_checkpoints(self) -> bool:
        """True where ``model`` and ``optimizer`` are plain torch objects (a ``torch.optim.Optimizer``, an LR
        ``scheduler``) that ``torch.distributed.checkpoint`` reads and writes, every rank its own shards
        (:mod:`services.learner.training.sharded_state`): the torch and fsdp backends."""
        return False

    @property
    def owns_parameter_memory(self) -> bool:
        """True where the backend lays parameters out itself (DeepSpeed's flat partitions, FSDP's shards), so
        nothing else may re-point them (see WeightPublisher.flatten)."""
        return False

    @property
    def lockstep(self) -> bool:
        """True where every forward or backward is a collective (FSDP, DeepSpeed ZeRO): every rank must run as
        many passes of each model (see :mod:`services.learner.training.lockstep`)."""
        return False

    @property
    def dtensor_parameters(self) -> bool:
        """True where the parameters are DTensor shards (FSDP2): the publisher gathers them bucket by bucket
        (:class:`~services.learner.weights.shards.ShardedWeights`)."""
        return False

    @property
    def runner(self) -> nn.Module:
        """What the trainer calls for a forward pass of ``model``: ``model`` itself, except where the backend
        wraps the forward (DeepSpeed's engine, whose ``forward`` starts ZeRO's backward bookkeeping)."""
        return self.model

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
