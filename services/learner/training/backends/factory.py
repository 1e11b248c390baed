"""The optimizer backends by name: the one module that knows every backend (``base`` knows none of them).

Each :class:`Backend` builds the engine of a trainable model and prepares a forward-only one (the reference)
the same way: sharded under ``fsdp``, as it is under ``torch``. ``auto`` (the default) is ``torch`` on one rank
and ``fsdp`` on more (:func:`resolve_backend`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from services.learner.settings import (
    BackendSettings,
    FSDPBackendSettings,
    OptimSettings,
    TorchBackendSettings,
)
from services.learner.training.backends.base import M, TrainEngine
from services.learner.training.backends.deepspeed_engine import (
    build_deepspeed_engine,  # imports deepspeed only when it builds one
)
from services.learner.training.backends.torch_engine import build_torch_engine, prepare_frozen
from services.learner.training.collectives import active
from services.learner.training.precision import Precision

EngineBuilder = Callable[..., TrainEngine]
FrozenPreparer = Callable[..., nn.Module]


def build_fsdp_engine(*args, **kwargs) -> TrainEngine:
    from services.learner.training.backends.fsdp_engine import (
        build_fsdp_engine as build,  # lazy: ~1 s of imports
    )

    return build(*args, **kwargs)


def shard_frozen(*args, **kwargs) -> nn.Module:
    from services.learner.training.backends.fsdp_engine import shard_frozen as shard

    return shard(*args, **kwargs)


@dataclass(frozen=True)
class Backend:
    engine: EngineBuilder  # (settings, model, lr, optim, total_steps, accumulation, precision) -> TrainEngine
    frozen: FrozenPreparer  # (settings, model, precision) -> the forward-only model, placed like the engine's


BACKENDS: dict[str, Backend] = {
    "torch": Backend(build_torch_engine, prepare_frozen),
    "fsdp": Backend(build_fsdp_engine, shard_frozen),
    "deepspeed": Backend(build_deepspeed_engine, prepare_frozen),  # run on CPU only so far (docs/learner.md)
}


def resolve_backend(backend: BackendSettings, lora: bool = False) -> BackendSettings:
    """``auto``: ``fsdp`` when the learner has more than one rank (a process group of more than one) and trains
    the whole model, else ``torch`` (one rank, or LoRA adapters: small, replicated); any other name as it is."""
    if backend.name != "auto":
        return backend
    return FSDPBackendSettings() if active() and not lora else TorchBackendSettings()


def _backend(backend: BackendSettings) -> tuple[BackendSettings, Backend]:
    backend = resolve_backend(backend)  # the trainer resolves auto (knowing about LoRA) before it gets here
    if backend.name not in BACKENDS:
        raise ValueError(f"unknown backend {backend.name!r}; known: {sorted(BACKENDS)}")
    return backend, BACKENDS[backend.name]


def build_engine(backend: BackendSettings, model: M, lr: float, optim: OptimSettings, total_steps: int,
                 accumulation: int = 1, precision: Precision | None = None) -> TrainEngine[M]:
    """The engine for ``backend.name`` (``auto`` | ``torch`` | ``fsdp`` | ``deepspeed``)."""
    backend, spec = _backend(backend)
    return spec.engine(backend, model, lr, optim, total_steps, accumulation, precision=precision)


def prepare_frozen_model(backend: BackendSettings, model: nn.Module, precision: Precision | None = None) -> nn.Module:
    """A forward-only model (the reference) placed as ``backend`` places trainable ones."""
    backend, spec = _backend(backend)
    return spec.frozen(backend, model, precision=precision)
