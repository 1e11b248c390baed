"""The optimizer backends by name: the one module that knows every backend (``base`` knows none of them)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from services.learner.settings import BackendSettings, OptimSettings
from services.learner.training.backends.base import TrainEngine
from services.learner.training.backends.deepspeed_engine import (
    build_deepspeed_engine,  # imports deepspeed only when it builds one
)
from services.learner.training.backends.torch_engine import build_torch_engine

EngineBuilder = Callable[..., TrainEngine]
BACKENDS: dict[str, EngineBuilder] = {"torch": build_torch_engine, "deepspeed": build_deepspeed_engine}


def build_engine(backend: BackendSettings, model: nn.Module, lr: float, optim: OptimSettings, total_steps: int,
                 accumulation: int = 1) -> TrainEngine:
    """The engine for ``backend.name`` (``torch`` | ``deepspeed``)."""
    if backend.name not in BACKENDS:
        raise ValueError(f"unknown backend {backend.name!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[backend.name](backend, model, lr, optim, total_steps, accumulation)
