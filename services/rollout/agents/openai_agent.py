"""``openai_agent``: any program that talks to an OpenAI-compatible server, trained by pointing it at a session.

For each sample of a prompt task the worker opens a session on this replica and runs ``worker.program.command``
with the standard variables the ``openai`` client reads, ``OPENAI_BASE_URL`` (``<replica>/sessions/<id>/v1``)
and ``OPENAI_API_KEY``, plus ``FLEETRL_MODEL`` (the served model name) and ``FLEETRL_TASK`` (the task as JSON:
``id``, ``prompt`` — text or chat messages —, ``label``, ``metadata``, ``index``, ``group_size``, ``sampling``;
also written to the program's stdin). The program is the agent, unmodified: its calls to
``/v1/chat/completions`` (tools included) or ``/v1/completions`` are recorded token for token, each call that
extends the conversation continuing one trajectory (mask 1 on the model's ids, 0 on the template's and the
tools' ids in between), exactly as a session over HTTP records them.

Least privilege: the program's environment is only ``program.inherit_env`` (PATH, HOME and the like) of the
service's, ``program.env`` and the variables above (``OPENAI_API_KEY`` is the session's own key, not the
control token); ``FLEETRL_TASK`` holds the label only with ``program.show_label``; no file it writes (its
stdout and stderr included) grows past ``program.max_file_bytes``.

The reward: the reward service scores the model's last turn against the task's label, as ``multi_turn`` does.
With ``program.reward_from_output``, a last stdout line that is a JSON object with ``"reward"`` (and optionally
``"reward_components"``) is the reward instead. A run that exits non-zero, outlives ``program.timeout_s`` (its process group is killed),
makes no model call, has a call aborted by a weight switch, or rewrites its history (its calls are not one
conversation: a session would give several trajectories, a sample is one) fails with that reason and is run
again up to ``program.retries`` times; then the group fails (the worker redelivers, then dead-letters it with
the reason). The group's trajectories go to the experiences stream through the worker like any other group.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from services.rollout.agents.settings import ProgramSettings
from services.rollout.errors import RequestError
from services.rollout.sessions.store import Session, TooManySessions
from services.rollout.sessions.trajectory import Recording
from services.rollout.trajectory import Trajectory
from services.rollout.worker.contract import GroupFailed, RolloutContext, each_sample
from shared.reward_api import ScoreItem
from shared.session_api import SessionCreate

log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """One run of the program failed; the message says how."""


@dataclass(frozen=True)
class Run:
    """One finished run: its session's one trajectory, and the reward the program printed (None: score it)."""

    trajectory: Recording
    reward: float | None
    components: dict[str, float]


async def openai_agent(ctx: RolloutContext) -> list[Trajectory]:
    cfg: ProgramSettings = ctx.settings.program
    if ctx.sessions is None or not ctx.sessions.url:
        raise GroupFailed("openai_agent needs this replica's session mode (sessions.enabled) and its URL "
                          "(advertise_url, or a fixed port)")
    ctx.check_prompt_size()  # a prompt that cannot fit is refused before any program runs
    runs = await each_sample(lambda i: _with_retries(ctx, cfg, i), ctx.task.n)  # a cancelled run kills its program
    return await _score(ctx, runs)


async def _with_retries(ctx: RolloutContext, cfg: ProgramSettings, index: int) -> Run:
    failures: list[str] = []
    while True:
        try:
            return await _run(ctx, cfg, index)
        except RunFailed as exc:
            failures.append(str(exc))
            if len(failures) > cfg.retries:
                raise GroupFailed(f"sample {index} of {ctx.task.id}: the agent program failed {len(failures)} "
                                  f"times; last: {failures[-1]}") from exc
            log.warning("task %s, sample %d: the agent program failed (%s); running it again", ctx.task.id, index, exc)


def task_json(ctx: RolloutContext, index: int) -> str:
    """What the program gets as ``FLEETRL_TASK`` (and on stdin)."""
    task, p = ctx.task, ctx.params
    prompt: Any = task.prompt if isinstance(task.prompt, str) or task.prompt is None else \
        [m.model_dump(exclude_none=True) for m in task.prompt]
    if prompt is None:
        prompt = ctx.tokenizer.decode(list(task.prompt_token_ids or []), skip_special_tokens=False)
    label = {"label": task.label} if ctx.settings.program.show_label else {}
    return json.dumps({"id": task.id, "prompt": prompt, **label, "metadata": task.metadata,
                       "index": index, "group_size": task.n,
                       "sampling": {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_new_tokens}})


async def _run(ctx: RolloutContext, cfg: ProgramSettings, index: int) -> Run:
    sessions = ctx.sessions
    assert sessions is not None
    session = await open_session(ctx, index)
    sid, taken = session.id, False
    try:
        task = await ctx.off_loop(task_json, ctx, index)  # decodes a prompt given as ids: off the event loop
        out = await run_program(cfg, {
            "OPENAI_BASE_URL": f"{sessions.url}/sessions/{sid}/v1", "OPENAI_API_KEY": sessions.key(sid) or "",
            "FLEETRL_MODEL": ctx.model_name, "FLEETRL_TASK": task, "FLEETRL_SESSION_ID": sid}, task)
        try:
            session = await sessions.take(sid)
        except RequestError as exc:  # expired (sessions.ttl_s) while the program ran, or a call still in flight
            raise RunFailed(f"its session could not be taken: {exc}") from exc
        taken = True
        if not session.trajectories:
            raise RunFailed("it made no model call (OPENAI_BASE_URL is this run's session)")
        if len(session.trajectories) > 1:
            raise RunFailed(f"its {session.calls} calls are not one conversation (a call did not extend the one "
                            f"before; {len(session.trajectories)} trajectories): openai_agent trains one per sample; "
                            "keep the history append-only, or drive sessions over HTTP (one experience each)")
        (t,) = session.trajectories
        if t.finish == "abort":
            raise RunFailed("its last model call was aborted by a weight switch")
        reward, comps = reward_line(out) if cfg.reward_from_output else (None, {})
        return Run(t, reward, comps)
    finally:
        if not taken:
            try:
                await sessions.delete(sid)
            except RequestError:  # a call still in flight (the program was killed mid-call): it expires
                pass


async def open_session(ctx: RolloutContext, index: int) -> Session:
    """A session for sample ``index``; while this replica has ``sessions.max_sessions`` open (its agents and
    others'), it waits for one to close, saying so in its log."""
    sessions = ctx.sessions
    assert sessions is not None
    said = False
    while True:
        try:
            return await sessions.create(SessionCreate(prompt_id=ctx.task.id, group_size=ctx.task.n, index=index,
                                                       label=ctx.task.label))
        except TooManySessions as exc:
            if not said:
                log.info("task %s, sample %d: waiting for a session: %s", ctx.task.id, index, exc)
                said = True
            await asyncio.sleep(ctx.settings.poll_interval_s)
        except RequestError as exc:  # 503: Redis did not register it
            raise RunFailed(f"could not open a session: {exc}") from exc


async def run_program(cfg: ProgramSettings, env: dict[str, str], stdin: str) -> str:
    """Run the program with ``env`` added and ``stdin``; the tail of its stdout, or :class:`RunFailed`. Its output
    goes to files, not pipes: a process it leaves behind cannot hold a pipe open and keep the run waiting. Once it
    exits, or at the timeout, its process group (what it started, unless that left the group) is killed."""
    argv = [sys.executable if a == "{python}" else a for a in cfg.command]
    full_env = {**{k: os.environ[k] for k in cfg.inherit_env if k in os.environ}, **cfg.env, **env}
    if shutil.which(argv[0], path=full_env.get("PATH")) is None:
        raise RunFailed(f"could not start {argv[0]!r}: no such executable (on the program's PATH)")
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        fin.write(stdin.encode())
        fin.seek(0)
        try:  # through a shim that caps file sizes, then execs the program (no preexec_fn: the service has threads)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _LIMITED_EXEC, str(cfg.max_file_bytes), *argv, stdin=fin, stdout=fout,
                stderr=ferr, cwd=cfg.cwd, env=full_env, start_new_session=True)
        except OSError as exc:
            raise RunFailed(f"could not start {argv[0]!r}: {exc}") from exc
        try:
            await asyncio.wait_for(proc.wait(), cfg.timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            raise RunFailed(f"it did not finish within {cfg.timeout_s:g}s (worker.program.timeout_s); killed") from None
        finally:
            _kill(proc)
            if proc.returncode is None:
                await proc.wait()  # SIGKILLed: reaped at once
        out, err = _tail(fout, cfg.max_output_bytes), _tail(ferr, cfg.max_output_bytes)
        full = max(fout.seek(0, os.SEEK_END), ferr.seek(0, os.SEEK_END)) >= cfg.max_file_bytes
    if proc.returncode == -signal.SIGXFSZ or (proc.returncode != 0 and full):
        raise RunFailed(f"it wrote more than {cfg.max_file_bytes} bytes to a file or its output "
                        "(worker.program.max_file_bytes); stopped")
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise RunFailed(f"it exited with code {proc.returncode}" + (f": {' / '.join(tail)}" if tail else ""))
    return out.decode(errors="replace")


_LIMITED_EXEC = ("import os, resource, signal, sys; n = int(sys.argv[1]); "
                 "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
                 "os.execvp(sys.argv[2], sys.argv[2:])")
"""Run as ``python -c _LIMITED_EXEC <max bytes> <argv...>``: caps file sizes, then becomes the program."""


def _tail(f: Any, cap: int) -> bytes:
    """The last ``cap`` bytes written to ``f``."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - cap))
    return f.read()


def _kill(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the program and whatever it started
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def reward_line(stdout: str) -> tuple[float | None, dict[str, float]]:
    """The reward the program printed as its last stdout line (``{"reward": 1.0, "reward_components": {...}}``),
    or ``(None, {})``: the reward service scores it. A last line that is such an object with a reward that is
    not a finite number is :class:`RunFailed`."""
    lines = [x for x in stdout.strip().splitlines() if x.strip()]
    if not lines:
        return None, {}
    try:
        obj = json.loads(lines[-1])
    except ValueError:
        return None, {}
    if not isinstance(obj, dict) or "reward" not in obj:
        return None, {}
    reward, comps = obj["reward"], obj.get("reward_components", {})
    if isinstance(reward, int) and not isinstance(reward, bool):
        reward = float(reward) if abs(reward) < 2 ** 1023 else math.inf
    if not isinstance(reward, float) or not math.isfinite(reward):
        raise RunFailed(f"its reward line {lines[-1][:200]!r}: 'reward' must be a finite number")
    if not isinstance(comps, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                              for v in comps.values()):
        raise RunFailed(f"its reward line {lines[-1][:200]!r}: 'reward_components' must map names to numbers")
    return float(reward), {str(k): float(v) for k, v in comps.items()}


async def _score(ctx: RolloutContext, runs: list[Run]) -> list[Trajectory]:
    """Rewards: the program's where it printed one, the reward service's (one /score call, the model's last
    turn against the label) for the rest."""
    task, tok = ctx.task, ctx.tokenizer
    prompt_text = [tok.decode(r.trajectory.prompt_ids, skip_special_tokens=False) for r in runs]
    need = [i for i, r in enumerate(runs) if r.reward is None]
    scored: dict[int, tuple[float, dict[str, float]]] = {}
    if need:
        items = [ScoreItem(prompt=prompt_text[i], response=tok.decode(runs[i].trajectory.last_model_turn(),
                                                                      skip_special_tokens=True),
                           label=task.label, metadata=task.metadata) for i in need]
        reply = await ctx.score(items)
        scored.update(zip(need, reply.scored()))
    out = []
    for i, r in enumerate(runs):
        reward, comps = (r.reward, r.components or {"program": r.reward}) if r.reward is not None else scored[i]
        t = r.trajectory
        out.append(t.build(reward, comps, prompt_text[i], tok.decode(t.response_ids, skip_special_tokens=False),
                           {"turns": t.turns}))
    return out
