"""``multi_turn``: the rollout function for environments and tools, token-in / token-out.

Each trajectory of the group runs its own environment (``worker.agent.environment``, or the task's
``metadata.environment``). The ids grow by appending only: the rendered first prompt, then each model turn's
output ids exactly as the engine sampled them (never re-tokenised from text), then for each environment turn
the template's ids after an assistant turn (:meth:`ChatTokens.close_turn`) and the template's delta for the
environment's new messages (:meth:`ChatTokens.delta`, which ends with the next assistant header). The mask is 1
on the model's ids and 0 on the rest; each model turn records the weight version that sampled it.

A turn the model ends with tool calls runs them (with a timeout; a call it cannot read, an unknown tool or
arguments the tool refuses come back as error observations it sees); any other turn goes to the environment's
``step``. The trajectory ends when the environment is done (finish reason ``stop``), or with finish reason
``length`` at ``max_turns`` model turns or when the context is full (then ``on_length`` keeps, masks or
penalises it).

An environment or tool that raises, hangs past its timeout or answers something malformed fails the
trajectory with that reason; it is retried with a fresh environment up to ``trajectory_retries`` times, then
the group fails (the worker redelivers, then dead-letters it with the reason).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from services.rollout.agents.environments import (
    ENVIRONMENTS,
    BadEnvironmentOutput,
    Environment,
    EnvReply,
    EnvStart,
    check_reply,
    check_start,
    environment_args,
    load_environment,
)
from services.rollout.agents.settings import AgentSettings
from services.rollout.agents.tool_calls import parse_tool_calls
from services.rollout.agents.tools import ToolBox, ToolFailure, ToolResult
from services.rollout.chat_tokens import ChatTokens
from services.rollout.engines.types import SamplingParams, SequenceOutput
from services.rollout.trajectory import Trajectory, TrajectoryBuilder
from services.rollout.worker.contract import GroupFailed, PermanentTaskError, RolloutContext, each_sample
from services.rollout.worker.group import sampling_record
from shared.reward_api import ScoreItem
from shared.schemas import FinishReason

log = logging.getLogger(__name__)
_timeout = getattr(asyncio, "timeout", None)


class TrajectoryFailed(RuntimeError):
    """The environment or a tool failed this trajectory; the message says which and why."""


@dataclass(frozen=True)
class Episode:
    """A finished episode, before it is scored."""

    builder: TrajectoryBuilder
    finish: FinishReason
    reward: float | None  # the environment's, or None: the reward service scores it
    components: dict[str, float]
    final_text: str  # the model's last message (what the reward service scores)
    turns: int


async def multi_turn(ctx: RolloutContext) -> list[Trajectory]:
    cfg: AgentSettings = ctx.settings.agent
    try:
        name, factory, args = environment_of(ctx)
    except GroupFailed as exc:  # the task names what the settings do not allow: it can never succeed
        raise PermanentTaskError(str(exc)) from exc
    # one failing for good cancels the others (their environments are closed by their own finally)
    episodes = await each_sample(lambda i: _with_retries(ctx, cfg, name, factory, args, i), ctx.task.n)
    return await _score(ctx, cfg, episodes)


def environment_of(ctx: RolloutContext) -> tuple[str, Callable[..., Any], dict[str, Any]]:
    """The task's environment (its metadata.environment, a name the settings allow; else the settings') and its
    factory's arguments. Code runs only where the settings name it: a task's value is looked up, never imported."""
    cfg: AgentSettings = ctx.settings.agent
    meta = ctx.task.metadata
    name = meta.get("environment", cfg.environment)
    extra = meta.get("environment_args", {})
    if not isinstance(name, str) or not isinstance(extra, dict):
        raise GroupFailed("bad prompt task: metadata.environment must be a name and metadata.environment_args an "
                          "object")
    try:
        spec = allowed_environment(cfg, name, by_task="environment" in meta)
        factory = load_environment(spec)
        args = environment_args(spec, {**cfg.environment_args, **extra})  # checked against its settings model
    except ValueError as exc:
        raise GroupFailed(f"bad prompt task: {exc}") from exc
    return name, factory, args


def allowed_environment(cfg: AgentSettings, name: str, by_task: bool) -> str:
    """What to load for environment ``name``: the settings' ``environments`` entry, a registered name, or (the
    settings' own ``environment`` only) its import path. A task naming anything else is refused (ValueError)."""
    if name in cfg.environments:
        return cfg.environments[name]
    if name in ENVIRONMENTS or not by_task or name == cfg.environment:
        return name
    allowed = sorted({*cfg.environments, *ENVIRONMENTS, cfg.environment})
    raise ValueError(f"environment {name!r} is not one this worker allows a task to pick (names: "
                     f"{', '.join(allowed)}); an operator adds one under worker.agent.environments "
                     "{name: 'package.module:factory'}")


async def _with_retries(ctx: RolloutContext, cfg: AgentSettings, name: str, factory, args: dict, index: int) -> Episode:
    failures: list[str] = []
    while True:
        try:
            return await _episode(ctx, cfg, name, factory, args)
        except TrajectoryFailed as exc:
            failures.append(str(exc))
            if len(failures) > cfg.trajectory_retries:
                raise GroupFailed(f"trajectory {index} of {ctx.task.id} failed {len(failures)} times; last: "
                                  f"{failures[-1]}") from exc
            log.warning("task %s, trajectory %d failed (%s); retrying with a fresh environment", ctx.task.id,
                        index, exc)


async def _call(what: str, timeout: float, fn: Callable[..., Any], *args: Any) -> Any:
    """Await an environment method (async, or plain and run in a thread) within ``timeout``; any failure is
    :class:`TrajectoryFailed` naming ``what``."""
    try:
        if inspect.iscoroutinefunction(fn):
            if _timeout is not None:  # Python >= 3.11: no task of its own per call (wait_for makes one there)
                async with _timeout(timeout):
                    return await fn(*args)
            return await asyncio.wait_for(fn(*args), timeout)
        value = await asyncio.wait_for(asyncio.to_thread(fn, *args), timeout)
        return await asyncio.wait_for(value, timeout) if inspect.isawaitable(value) else value
    except (asyncio.TimeoutError, TimeoutError) as exc:
        raise TrajectoryFailed(f"{what} did not answer within {timeout:g}s") from exc
    except (GroupFailed, asyncio.CancelledError):
        raise
    except Exception as exc:
        raise TrajectoryFailed(f"{what} raised {type(exc).__name__}: {exc}") from exc


async def _episode(ctx: RolloutContext, cfg: AgentSettings, name: str, factory, args: dict) -> Episode:
    try:
        env = factory(**args)
    except Exception as exc:
        raise TrajectoryFailed(f"environment {name}: creating it raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(env, Environment):
        raise GroupFailed(f"environment {name}: its factory made a {type(env).__name__}, which has no reset / "
                          "step / close")
    try:
        return await _run(ctx, cfg, name, env)
    finally:
        try:
            await _call(f"environment {name}: close", cfg.env_timeout_s, env.close)
        except TrajectoryFailed as exc:
            log.warning("%s", exc)


async def _run(ctx: RolloutContext, cfg: AgentSettings, name: str, env: Environment) -> Episode:
    start = await _call(f"environment {name}: reset", cfg.env_timeout_s, env.reset, ctx.task)
    try:
        start = check_start(start, name)
    except BadEnvironmentOutput as exc:
        raise TrajectoryFailed(str(exc)) from exc
    box = ToolBox(start.tools, timeout_s=cfg.tool_timeout_s, max_result_chars=cfg.max_result_chars)
    schemas = [*box.schemas(), *(dict(s) for s in start.tool_schemas)]
    messages = [dict(m) for m in start.messages]
    ctx.check_prompt_size(messages)  # a first prompt past worker.max_prompt_chars is refused before it is tokenised
    chat = await ctx.chat_async(schemas or None)  # rendering and tokenising run on the replica's tokenizer thread
    try:
        prompt_ids = await ctx.off_loop(chat.prompt, messages)
    except Exception as exc:  # the template cannot render what the environment wrote
        raise TrajectoryFailed(f"environment {name}: the chat template cannot render its first messages: "
                               f"{type(exc).__name__}: {exc}") from exc
    if len(prompt_ids) >= ctx.context_length:
        raise PermanentTaskError(f"bad prompt task: the environment's first prompt has {len(prompt_ids)} tokens; the "
                          f"context length is {ctx.context_length}")
    b = TrajectoryBuilder(prompt_ids)
    stops = tuple(dict.fromkeys([*ctx.params.stop_token_ids, *chat.stop_token_ids]))
    base = replace(ctx.params, stop_token_ids=stops)
    text = ""
    for turn in range(1, cfg.max_turns + 1):
        out = await _model_turn(ctx, b, base)
        b.model(out.output_ids, out.logprobs, out.weight_version, out.version_spans)
        text = out.text
        reply = await _respond(cfg, name, env, box, start, text)
        if reply.done:
            return Episode(b, "stop", reply.reward, dict(reply.components), text, turn)
        if turn == cfg.max_turns:
            break
        env_ids = [*chat.close_turn(out.output_ids), *await ctx.off_loop(_delta, chat, reply, name)]
        if len(b) + len(env_ids) >= ctx.context_length:  # no room for the reply and one more token
            break
        b.environment(env_ids)
    return Episode(b, "length", None, {}, text, b.model_turns)


async def _model_turn(ctx: RolloutContext, b: TrajectoryBuilder, base: SamplingParams) -> SequenceOutput:
    """One model turn continuing the trajectory's ids; a turn aborted by a weight switch is sampled again
    from the same ids (its versions are recorded turn by turn)."""
    for _ in range(ctx.settings.group_retries + 1):
        context = b.context
        params = replace(base, max_new_tokens=max(1, ctx.room(context, base.max_new_tokens)))
        (out,) = await ctx.generate(context, params, n=1)
        if out.finish is not None and out.finish.type != "abort":
            return out
    raise GroupFailed(f"a model turn of {ctx.task.id} was aborted {ctx.settings.group_retries + 1} times")


async def _respond(cfg: AgentSettings, name: str, env: Environment, box: ToolBox, start: EnvStart,
                   text: str) -> EnvReply:
    """The tools' results for a turn with tool calls (when the environment gave tools), else the environment's
    step on the assistant message."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if box.tools or start.tool_schemas:
        parsed = parse_tool_calls(text, cfg.tool_call_format)
        if parsed.calls or parsed.errors:
            message = {"role": "assistant", "content": parsed.content,
                       "tool_calls": [c.openai() for c in parsed.calls]}
            if box.tools:
                return EnvReply(messages=await _run_tools(box, parsed.calls, parsed.errors))
    reply = await _call(f"environment {name}: step", cfg.env_timeout_s, env.step, message)
    try:
        return check_reply(reply, name)
    except BadEnvironmentOutput as exc:
        raise TrajectoryFailed(str(exc)) from exc


async def _run_tools(box: ToolBox, calls, errors: list[str]) -> list[dict[str, Any]]:
    """One ``tool`` message per call (errors the model made included, as observations)."""
    out = [{"role": "tool", "content": f"error: {e}"} for e in errors]
    for call in calls:
        try:
            result: ToolResult = await box.call(call)
        except ToolFailure as exc:
            raise TrajectoryFailed(str(exc)) from exc
        out.append(result.message())
    return out


def _delta(chat: ChatTokens, reply: EnvReply, name: str) -> list[int]:
    try:
        return chat.delta([dict(m) for m in reply.messages])
    except Exception as exc:
        raise TrajectoryFailed(f"environment {name}: the chat template cannot render its reply: "
                               f"{type(exc).__name__}: {exc}") from exc


async def _score(ctx: RolloutContext, cfg: AgentSettings, episodes: list[Episode]) -> list[Trajectory]:
    """Rewards: the environment's where it gave one, the reward service's (one /score call) for the rest;
    a cut trajectory is kept, masked or penalised as ``on_length`` says."""
    task = ctx.task
    record = sampling_record(ctx.params)
    prompt = task.prompt if task.prompt is not None else await ctx.off_loop(
        lambda: ctx.tokenizer.decode(list(episodes[0].builder.prompt_ids), skip_special_tokens=False))
    need = [i for i, e in enumerate(episodes) if e.reward is None
            and not (e.finish == "length" and cfg.on_length == "penalize")]
    scored: dict[int, tuple[float, dict[str, float]]] = {}
    if need:
        items = [ScoreItem(prompt=prompt, response=episodes[i].final_text, label=task.label,
                           metadata=task.metadata) for i in need]
        reply = await ctx.score(items)
        scored.update(zip(need, reply.scored()))
    texts: dict[tuple[int, ...], str] = {}  # the group's trajectories mostly share their prompt: decoded once

    def prompt_text(ids: tuple[int, ...]) -> str:
        if ids not in texts:
            texts[ids] = ctx.tokenizer.decode(list(ids), skip_special_tokens=False)
        return texts[ids]

    def decoded() -> list[tuple[str, str]]:  # on the tokenizer thread: a group holds up to n x the context
        return [(prompt_text(e.builder.prompt_ids), ctx.tokenizer.decode(list(e.builder.ids), skip_special_tokens=False))
                for e in episodes]

    out = []
    reward: float
    comps: dict[str, float]
    for (p_text, r_text), (i, e) in zip(await ctx.off_loop(decoded), enumerate(episodes)):
        if e.finish == "length" and cfg.on_length == "penalize":
            reward, comps = cfg.length_penalty, {"length_penalty": cfg.length_penalty}
        elif e.reward is not None:
            reward, comps = float(e.reward), dict(e.components) or {"environment": float(e.reward)}
        else:
            reward, comps = scored[i]
        t = e.builder.build(
            finish_reason=e.finish, reward=reward, sampling=record, reward_components=comps,
            prompt_text=p_text, response_text=r_text,
            metadata={"turns": e.turns},
        )
        out.append(t.masked() if e.finish == "length" and cfg.on_length == "mask" else t)
    return out
