"""The environment protocol of multi-turn rollouts, and environments by name or import path.

An environment is created per trajectory (``factory(**args)``) and driven by the ``multi_turn`` rollout
function::

    start = await env.reset(task)        # EnvStart: the first messages (+ tools the model may call)
    reply = await env.step(message)      # on each assistant message without tool calls -> EnvReply:
                                         # the environment's messages, done, optional reward (+ components)
    await env.close()                    # always, however the trajectory ended

Tools given as :class:`~services.rollout.agents.tools.Tool` (an OpenAI function schema and a Python function)
are run by the rollout function with a timeout; their results go back to the model as ``tool`` messages and
``step`` is not called for that turn. An environment that handles tool calls itself declares none and reads
``message["tool_calls"]`` in ``step`` (parsed from the model's text when it declares ``tool_schemas``).

When the episode is done without a reward, the reward service scores the final answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from services.rollout.agents.tools import Tool
from shared.schemas import PromptTask
from shared.service_kit.loader import LoadError, load_object

_ROLES = ("system", "user", "assistant", "tool")


class BadEnvironmentOutput(ValueError):
    """An environment answered something that is not what the protocol says (the message says what)."""


@dataclass(frozen=True)
class EnvStart:
    """What an episode starts from."""

    messages: Sequence[Mapping[str, Any]]  # OpenAI chat messages: the prompt
    tools: Sequence[Tool] = ()  # tools the rollout function runs for the model
    tool_schemas: Sequence[Mapping[str, Any]] = ()  # tools the environment runs itself, in step()


@dataclass(frozen=True)
class EnvReply:
    """The environment's answer to one assistant message."""

    messages: Sequence[Mapping[str, Any]] = ()
    done: bool = False
    reward: float | None = None  # None: let the reward service score the episode
    components: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode of a multi-turn task. Every method may be async (it is awaited) or plain."""

    async def reset(self, task: PromptTask) -> EnvStart: ...

    async def step(self, message: dict[str, Any]) -> EnvReply: ...

    async def close(self) -> None: ...


EnvironmentFactory = Callable[..., Environment]

ENVIRONMENTS: dict[str, str] = {
    "echo": "services.rollout.agents.envs.echo:EchoEnv",
    "calculator": "services.rollout.agents.envs.calculator:CalculatorEnv",
    "reasoning_gym": "services.rollout.agents.envs.reasoning_gym:ReasoningGymEnv",
    "openenv": "services.rollout.agents.envs.openenv:OpenEnvEnvironment",
}


def load_environment(spec: str) -> EnvironmentFactory:
    """The environment factory ``spec`` names (a registered name or ``package.module:factory``)."""
    if ":" not in spec and spec not in ENVIRONMENTS:
        raise LoadError(f"environment {spec!r}: not a known name ({', '.join(sorted(ENVIRONMENTS))}) nor an "
                        "import path 'package.module:factory'")
    factory = load_object(ENVIRONMENTS.get(spec, spec), what="environment")
    if not callable(factory):
        raise LoadError(f"environment {spec!r}: {type(factory).__name__} object is not a factory (a class or a "
                        "function returning an Environment)")
    return factory


def check_messages(messages: Any, what: str) -> list[dict[str, Any]]:
    """``messages`` as a list of chat messages, or a BadEnvironmentOutput saying what is wrong with them."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise BadEnvironmentOutput(f"{what}: messages must be a list of chat messages, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise BadEnvironmentOutput(f"{what}: message {i} is a {type(m).__name__}, not a chat message")
        if m.get("role") not in _ROLES:
            raise BadEnvironmentOutput(f"{what}: message {i} has role {m.get('role')!r}; roles: {', '.join(_ROLES)}")
        if not isinstance(m.get("content"), str):
            raise BadEnvironmentOutput(f"{what}: message {i} has no text content")
        out.append(dict(m))
    return out


def check_start(start: Any, name: str) -> EnvStart:
    if not isinstance(start, EnvStart):
        raise BadEnvironmentOutput(f"environment {name}: reset returned {type(start).__name__}, not an EnvStart")
    if not check_messages(start.messages, f"environment {name}: reset"):
        raise BadEnvironmentOutput(f"environment {name}: reset returned no messages")
    bad = next((t for t in start.tools if not isinstance(t, Tool)), None)
    if bad is not None:
        raise BadEnvironmentOutput(f"environment {name}: reset returned a tool that is a {type(bad).__name__}, not a Tool")
    return start


def check_reply(reply: Any, name: str) -> EnvReply:
    if not isinstance(reply, EnvReply):
        raise BadEnvironmentOutput(f"environment {name}: step returned {type(reply).__name__}, not an EnvReply")
    check_messages(reply.messages, f"environment {name}: step")
    if not isinstance(reply.done, bool):
        raise BadEnvironmentOutput(f"environment {name}: step returned done={reply.done!r}, not a bool")
    values = ([reply.reward] if reply.reward is not None else []) + list(reply.components.values())
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in values):
        raise BadEnvironmentOutput(f"environment {name}: step returned a reward that is not a finite number "
                         f"(reward={reply.reward!r}, components={dict(reply.components)!r})")
    if not reply.done and not reply.messages:
        raise BadEnvironmentOutput(f"environment {name}: step returned no messages and is not done")
    return reply
