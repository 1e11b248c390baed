"""The runner contract: what the learner service asks of the object that owns a run.

Every algorithm names its runner (``LearnerAlgorithm.runner``: ``RLRunner`` for the RL algorithms,
``SFTRunner`` for sft, ``PreferenceRunner`` for the preference ones, or a plug-in's own). The service builds one
(``cls(settings, redis, sink)``; ``redis`` is None unless the class says ``needs_redis``), awaits ``run(stop)``
until the run ends or ``stop`` is set, reports ``status()`` and ``phase`` / ``error`` in its health and status
routes, and asks ``request_checkpoint()`` for a checkpoint now (a future resolved with ``{"step", "path"}`` once it is
written; a RuntimeError in it: none can be written now). A runner may
also say ``weights_problem`` (replicas behind on weights, and why); the service reads it when it is there.
:func:`runner_problem` checks a class against this when the learner starts, in one line. Torch-free.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, ClassVar, Protocol

__all__ = ["Runner", "runner_problem"]


class Runner(Protocol):
    """What the learner service calls on the runner that owns a run (see the module docstring)."""

    needs_redis: ClassVar[bool]
    phase: str
    error: str | None

    def __init__(self, settings: Any, redis: Any, sink: Any) -> None: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def request_checkpoint(self) -> asyncio.Future: ...


#: what a runner class defines itself (``phase`` and ``error`` are set on each instance)
_CLASS_MEMBERS = ("needs_redis", "run", "status", "request_checkpoint")


def runner_problem(cls: Any) -> str | None:
    """Why ``cls`` is not a :class:`Runner` class (one line), or None when it is."""
    if not inspect.isclass(cls):
        return f"{cls!r} is not a runner class"
    missing = [m for m in _CLASS_MEMBERS if not hasattr(cls, m)]
    if missing:
        return f"class {cls.__qualname__} is not a Runner (missing: {', '.join(missing)})"
    needs_redis, run = getattr(cls, "needs_redis"), getattr(cls, "run")  # noqa: B009 - present, checked above
    if not isinstance(needs_redis, bool):
        return f"class {cls.__qualname__}: needs_redis must be a bool, got {needs_redis!r}"
    if not inspect.iscoroutinefunction(run):
        return f"class {cls.__qualname__}: run(stop) must be async (`async def run(self, stop)`)"
    try:
        inspect.signature(cls).bind("settings", "redis", "sink")
    except TypeError as exc:
        return f"class {cls.__qualname__} cannot be built as a Runner (settings, redis, sink): {exc}"
    return None
