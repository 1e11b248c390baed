"""Worker processes for a python scorer's sync function: a call that outlives its timeout is killed, and so
is the worker, which is replaced; a stuck function never holds capacity past its scorer's ``timeout_s``.

A thread cannot be stopped, so a function that hangs in a thread holds that thread for good; a process can.
Each worker (``python_worker.py``) runs one call at a time. The pool starts one worker when the scorer starts
(a function that cannot be loaded fails the service's start, naming the path) and more on demand, up to
``size``. A call is cancelled when the service's per-try timeout fires: its worker is then SIGKILLed and a
replacement started in the background. A worker that dies by itself fails its call (retried like any
failure) and is replaced too. Replacements are counted (``fleetrl_reward_python_workers_replaced``) and the
last reason is on ``/health`` while the pool is short of workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from services.reward.errors import ScorerFailure
from services.reward.scorers.frames import HEADER, MAX_FRAME, encode_frame
from shared.service_kit.loader import LoadError

log = logging.getLogger("fleetrl.reward")

_ROOT = str(Path(__file__).resolve().parents[3])  # where `services` is importable from
WORKER_START_TIMEOUT_S = 120.0
"""A worker that has not loaded the function within this is killed (a start that hangs)."""


class WorkerDied(ScorerFailure):
    """The worker process ended during a call (the function crashed it, or it was killed)."""


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process):
        assert proc.stdin is not None and proc.stdout is not None, "a worker is started with stdin and stdout pipes"
        self.proc = proc
        self.stdin, self.stdout = proc.stdin, proc.stdout

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            self.stdin.write(encode_frame(request))
            await self.stdin.drain()
            (size,) = HEADER.unpack(await self.stdout.readexactly(HEADER.size))
            if size > MAX_FRAME:
                raise WorkerDied(f"worker {self.proc.pid} sent a frame of {size} bytes")
            return json.loads(await self.stdout.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
            code = await _exit_code(self.proc)
            raise WorkerDied(f"worker process {self.proc.pid} died during the call (exit code {code})") from exc

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


async def _exit_code(proc: asyncio.subprocess.Process) -> int | None:
    try:
        return await asyncio.wait_for(proc.wait(), 5.0)
    except asyncio.TimeoutError:
        return None


class WorkerPool:
    """``size`` worker processes for one scorer; ``run(request)`` is one call on an idle worker."""

    def __init__(self, name: str, hello: dict[str, Any], size: int, on_replace=None):
        self.name = name
        self.size = size
        self._hello = {**hello, "sys_path": [p for p in sys.path if isinstance(p, str)]}
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._count = 0  # live workers plus those starting
        self._closed = False
        self._tasks: set[asyncio.Task] = set()
        self._workers: set[_Worker] = set()  # every live worker, idle or in a call
        self._on_replace = on_replace or (lambda reason: None)
        self.spawn_error: str | None = None  # why the last replacement failed to start (cleared by a start)

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the first worker; raises LoadError when the function cannot be loaded there."""
        self._count += 1
        try:
            self._idle.put_nowait(await self._spawn())
        except BaseException:
            self._count -= 1
            raise

    async def close(self) -> None:
        """Stop every worker (idle or in a call) and reap it."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        workers = list(self._workers)
        for worker in workers:
            worker.kill()
        await asyncio.gather(*(_exit_code(w.proc) for w in workers))

    def check(self) -> str | None:
        """None when the pool can take calls; else why it is short of workers."""
        return self.spawn_error

    # ---- calls -------------------------------------------------------------------------------------
    async def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One call on an idle worker (started on demand). Cancelled (the scorer's timeout): the worker is
        killed and replaced, so the call frees its capacity."""
        worker = await self._acquire()
        try:
            reply = await worker.call(request)
        except asyncio.CancelledError:
            self._replace(worker, "a call outlived its timeout")
            raise
        except WorkerDied as exc:
            self._replace(worker, exc.message)
            raise
        except BaseException:
            self._replace(worker, "the call failed in the pool")
            raise
        self._idle.put_nowait(worker)
        return reply

    async def _acquire(self) -> _Worker:
        if self._closed:
            raise ScorerFailure("the scorer is closing", retryable=False)
        if self._idle.empty() and self._count < self.size:
            self._count += 1  # another worker, started beside the wait: the call takes whichever is idle first
            self._background(self._add_worker(None, retry=False))
        return await self._idle.get()

    def _replace(self, worker: _Worker, reason: str) -> None:
        """Kill ``worker`` (one process, by its pid) and start another in the background."""
        worker.kill()
        self._workers.discard(worker)
        if self._closed:
            return
        log.warning("python scorer %s: worker %d killed (%s); starting a replacement", self.name, worker.proc.pid,
                    reason)
        self._on_replace(reason)
        self._background(self._add_worker(worker, retry=True))

    def _background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"reward-{self.name}-worker")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add_worker(self, old: _Worker | None, retry: bool) -> None:
        """Start a worker (its slot in ``_count`` is already taken) and make it idle; a replacement retries."""
        if old is not None:
            await _exit_code(old.proc)  # reap it
        delay = 0.5
        try:
            while not self._closed:
                try:
                    self._idle.put_nowait(await self._spawn())
                    self.spawn_error = None
                    return
                except Exception as exc:  # noqa: BLE001 - reported on /health
                    self.spawn_error = f"a worker process failed to start: {exc}"
                    log.error("python scorer %s: %s", self.name, self.spawn_error)
                if not retry:
                    break
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)
        except asyncio.CancelledError:
            pass
        self._count -= 1

    async def _spawn(self) -> _Worker:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.reward.scorers.python_worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        )
        worker = _Worker(proc)
        self._workers.add(worker)
        try:
            reply = await asyncio.wait_for(worker.call(self._hello), WORKER_START_TIMEOUT_S)
            if "error" in reply:
                raise LoadError(reply["error"])
            return worker
        except BaseException as exc:
            worker.kill()
            self._workers.discard(worker)
            if not isinstance(exc, asyncio.CancelledError):
                await _exit_code(proc)
            if isinstance(exc, asyncio.TimeoutError):
                raise LoadError(f"python scorer {self.name}: a worker process did not load the function within "
                                f"{WORKER_START_TIMEOUT_S:.0f}s") from None
            if isinstance(exc, WorkerDied):
                raise LoadError(f"python scorer {self.name}: {exc.message}") from exc
            raise
