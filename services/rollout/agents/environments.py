"""The environment protocol of multi-turn rollouts, and environments by name (the environment plug-in point,
:data:`ENVIRONMENTS`: each name's argument settings and factory) or import path.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.rollout.agents.tools import Tool
from shared.plugins import PluginPoint
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


@runtime_checkable
class EnvironmentFactory(Protocol):
    """What an environment kind's implementation is (the base of the environment plug-in point, checked when
    it loads): a class making an :class:`Environment` (it must define ``reset``, ``step`` and ``close``) or a
    function returning one, called with the environment's arguments (``environment_args``) as keywords."""

    def __call__(self, **args: Any) -> Environment: ...


class _EnvArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EchoArgs(_EnvArgs):
    """echo: answers every assistant message with ``reply`` for ``turns`` turns (a test environment)."""

    turns: int = Field(default=2, ge=1, description="Assistant turns before the episode is done.")
    reply: str = Field(default="go on", description="The environment's message after each turn.")
    reward: float | None = Field(default=None, description="The episode's reward; unset: the reward service scores.")


class CalculatorArgs(_EnvArgs):
    """calculator: a calculator tool, the episode judged against the task's label."""

    judge: Literal["environment", "reward_service"] = Field(
        default="environment", description="Who scores the final answer: this environment or the reward service.")


class ReasoningGymArgs(_EnvArgs):
    """reasoning_gym: a reasoning-gym task named by the prompt task's metadata.reasoning_gym (no arguments)."""


class OpenEnvArgs(_EnvArgs):
    """openenv: an OpenEnv environment server driven through its own client (the ``agents`` extra)."""

    base_url: str = Field(description="The OpenEnv server's URL.")
    action_field: str = Field(default="message", description="The action field the assistant's text goes in.")
    observation_field: str | None = Field(default=None, description="The observation field shown; unset: all of it.")
    reset_args: dict[str, Any] = Field(default_factory=dict, description="Arguments of reset (e.g. a seed).")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="Connect timeout.")
    message_timeout_s: float = Field(default=30.0, gt=0, description="Timeout of one message.")


#: environments by name: the settings model of their factory's arguments (``environment_args``; None: passed
#: through unchecked) -> the factory (a class or function returning an Environment). Register your own with
#: ``ENVIRONMENTS.register("mine", MyArgs, "package.module:MyEnv")`` (docs/plugins.md); an operator may also
#: name a factory by import path in the settings (never a task).
ENVIRONMENTS: PluginPoint[EnvironmentFactory] = PluginPoint(
    "environment", where="rollout: worker.agent.environment (arguments: environment_args)", tag=None,
    doc="Multi-turn environments (services/rollout/agents/envs).", base=EnvironmentFactory)
ENVIRONMENTS.register("echo", EchoArgs, "services.rollout.agents.envs.echo:EchoEnv")
ENVIRONMENTS.register("calculator", CalculatorArgs, "services.rollout.agents.envs.calculator:CalculatorEnv")
ENVIRONMENTS.register("reasoning_gym", ReasoningGymArgs, "services.rollout.agents.envs.reasoning_gym:ReasoningGymEnv")
ENVIRONMENTS.register("openenv", OpenEnvArgs, "services.rollout.agents.envs.openenv:OpenEnvEnvironment")


def load_environment(spec: str) -> EnvironmentFactory:
    """The environment factory ``spec`` names (a registered name or ``package.module:factory``)."""
    if spec in ENVIRONMENTS:
        return ENVIRONMENTS.load(spec)  # checked against EnvironmentFactory (and its arguments' model)
    if ":" in spec:
        return load_object(spec, EnvironmentFactory, what="environment")
    raise LoadError(f"environment {spec!r}: not a known name ({', '.join(sorted(ENVIRONMENTS))}) nor an "
                    "import path 'package.module:factory'")


def environment_args(spec: str, args: Mapping[str, Any], *, partial: bool = False) -> dict[str, Any]:
    """The factory's keyword arguments for environment ``spec``: ``args`` checked against the settings model
    the environment registered (ValueError saying what is wrong), the keys given; an environment by import path
    or registered without a model takes them as they are. ``partial``: settings-time check of the settings'
    own arguments, which tasks may complete (a missing required argument is not an error yet)."""
    model = ENVIRONMENTS.settings_model(spec) if spec in ENVIRONMENTS else None
    if model is None:
        return dict(args)
    try:
        return model.model_validate(dict(args)).model_dump(exclude_unset=True)
    except ValidationError as exc:
        problems = [e for e in exc.errors() if not (partial and e["type"] == "missing")]
        if not problems:
            return dict(args)
        said = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in problems)
        raise ValueError(f"environment {spec!r} arguments: {said}") from None


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
