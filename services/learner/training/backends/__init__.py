"""Optimizer backends by name: ``torch`` (replicated), ``fsdp`` (FSDP2 shards) and ``deepspeed`` (ZeRO-2/3,
run on CPU only so far), chosen by settings (``auto``: torch on one rank, fsdp on more).

``build_engine(backend_settings, model, lr, optim, total_steps, accumulation)`` returns a
:class:`~.base.TrainEngine`; trainers only call its ``backward`` / ``step`` / ``save_state`` /
``load_state`` / ``lr``.
"""

from services.learner.training.backends.base import TrainEngine
from services.learner.training.backends.factory import (
    BACKENDS,
    build_engine,
    prepare_frozen_model,
    resolve_backend,
)

__all__ = ["BACKENDS", "TrainEngine", "build_engine", "prepare_frozen_model", "resolve_backend"]
