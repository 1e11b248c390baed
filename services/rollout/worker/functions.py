"""Rollout functions by name or import path, through the rollout-function plug-in point
(:data:`ROLLOUT_FUNCTIONS`): ``worker.rollout_function`` is ``single_turn`` (one prompt -> ``n`` samples),
``multi_turn`` (environments and tools, token-in / token-out; its settings: ``worker.agent``),
``openai_agent`` (your agent program per sample, its OpenAI-client calls recorded through a session; its
settings: ``worker.program``), a name you registered (its settings: ``worker.function_settings``, checked
against the model it registered), or ``package.module:function`` (your own). Every one is loaded with the
service kit's loader and checked against :class:`RolloutFunction` (an ``async`` callable taking the
context), so a wrong path or signature is a settings error, not a failure at the first prompt."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from services.rollout.worker.contract import RolloutFunction
from shared.plugins import PluginPoint
from shared.service_kit.loader import LoadError, load_object

#: rollout functions by name: settings model (None: none of its own) -> ``async def fn(ctx) -> list[Trajectory]``.
#: Register your own with ``ROLLOUT_FUNCTIONS.register("mine", MySettings, "package.module:fn")`` (docs/plugins.md).
ROLLOUT_FUNCTIONS: PluginPoint[Any] = PluginPoint(
    "rollout function", where="rollout: worker.rollout_function (settings: worker.function_settings)", tag=None,
    doc="What the rollout worker does with a prompt task (services/rollout/worker/contract.py).",
    base=RolloutFunction)
ROLLOUT_FUNCTIONS.register("single_turn", None, "services.rollout.worker.single_turn:single_turn")
ROLLOUT_FUNCTIONS.register("multi_turn", "services.rollout.agents.settings:AgentSettings", "services.rollout.agents.multi_turn:multi_turn",
                           doc="Environments and tools, token-in / token-out; its settings are worker.agent.")
ROLLOUT_FUNCTIONS.register("openai_agent", "services.rollout.agents.settings:ProgramSettings", "services.rollout.agents.openai_agent:openai_agent",
                           doc="Your agent program per sample, recorded through a session; its settings are "
                           "worker.program.")

#: the built-in functions whose settings have a section of their own (the rest: worker.function_settings)
OWN_SECTIONS = {"multi_turn": "agent", "openai_agent": "program"}


def rollout_function_path(spec: str) -> str:
    """The import path ``spec`` names (a registered name, or already a path)."""
    return ROLLOUT_FUNCTIONS.entry(spec).impl_path if spec in ROLLOUT_FUNCTIONS else spec


def load_rollout_function(spec: str) -> Any:
    """The rollout function ``spec`` names, checked; raises :class:`LoadError` saying what is wrong."""
    if spec in ROLLOUT_FUNCTIONS:
        fn = ROLLOUT_FUNCTIONS.load(spec)
    elif ":" in spec:
        fn = load_object(spec, RolloutFunction, what="rollout function")
    else:
        raise LoadError(f"rollout function {spec!r}: not a known name ({', '.join(sorted(ROLLOUT_FUNCTIONS))}) "
                        "nor an import path 'package.module:function'")
    return fn  # checked against RolloutFunction on loading: an async callable taking the context


def function_settings(spec: str, value: Any) -> BaseModel | None:
    """``worker.function_settings`` checked against the settings model rollout function ``spec`` registered
    (None when it registered none, or is named by import path: then there must be none)."""
    if spec in OWN_SECTIONS:
        if value:
            raise ValueError(f"rollout function {spec!r} takes its settings in worker.{OWN_SECTIONS[spec]}, not "
                             "worker.function_settings")
        return None
    if spec not in ROLLOUT_FUNCTIONS:
        if value:
            raise ValueError(f"rollout function {spec!r} is named by import path: it has no registered settings "
                             "model to check worker.function_settings against; register it (docs/plugins.md)")
        return None
    return ROLLOUT_FUNCTIONS.options(spec, value)
