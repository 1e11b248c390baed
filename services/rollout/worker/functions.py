"""Rollout functions by name or import path: ``worker.rollout_function`` is ``single_turn`` (one prompt ->
``n`` samples), ``multi_turn`` (environments and tools, token-in / token-out), ``openai_agent`` (your agent
program per sample, its OpenAI-client calls recorded through a session), or ``package.module:function``
(your own). Every one is loaded with the service kit's loader and checked against :class:`RolloutFunction`
(an ``async`` callable taking the context), so a wrong path or signature is a settings error, not a failure
at the first prompt."""

from __future__ import annotations

import inspect

from services.rollout.worker.contract import RolloutFunction
from shared.service_kit.loader import LoadError, load_object

ROLLOUT_FUNCTIONS: dict[str, str] = {
    "single_turn": "services.rollout.worker.single_turn:single_turn",
    "multi_turn": "services.rollout.agents.multi_turn:multi_turn",
    "openai_agent": "services.rollout.agents.openai_agent:openai_agent",
}


def rollout_function_path(spec: str) -> str:
    """The import path ``spec`` names (a registered name, or already a path)."""
    return ROLLOUT_FUNCTIONS.get(spec, spec)


def load_rollout_function(spec: str) -> RolloutFunction:
    """The rollout function ``spec`` names, checked; raises :class:`LoadError` saying what is wrong."""
    if ":" not in spec and spec not in ROLLOUT_FUNCTIONS:
        raise LoadError(f"rollout function {spec!r}: not a known name ({', '.join(sorted(ROLLOUT_FUNCTIONS))}) "
                        "nor an import path 'package.module:function'")
    fn = load_object(rollout_function_path(spec), RolloutFunction, what="rollout function")
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "__call__", None)  # noqa: B004
    if not inspect.iscoroutinefunction(target):
        raise LoadError(f"rollout function {spec!r}: must be async (async def fn(ctx) -> list[Trajectory])")
    return fn
