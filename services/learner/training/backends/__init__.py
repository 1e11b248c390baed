"""Optimizer backends by name: ``torch`` (one device) and ``deepspeed`` (ZeRO-2/3), chosen by settings.

``build_engine(backend_settings, model, lr, optim, total_steps, accumulation)`` returns a
:class:`~.base.TrainEngine`; trainers only call its ``backward`` / ``step`` / ``save_state`` /
``load_state`` / ``lr``.
"""

from services.learner.training.backends.base import TrainEngine
from services.learner.training.backends.factory import BACKENDS, build_engine

__all__ = ["BACKENDS", "TrainEngine", "build_engine"]
