"""``LearnerService``: the one object the app owns. Starts the run owner (the runner the algorithm registered)
as an asyncio task, answers status / health, and forwards control (checkpoint now, stop)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from services.learner.algorithms.rl_algorithms import runner_class
from services.learner.observability import MetricsSink
from services.learner.runner import Runner
from services.learner.settings import LearnerSettings
from services.learner.watches.rollout import RolloutWatch
from shared.redact import redact_url
from shared.redis_errors import REDIS_FAILED
from shared.service_kit.errors import ServiceError

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)

class ControlError(ServiceError):
    """A control request cannot be served now: 409 (the run's phase does not allow it) or 504 (timed out)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail, status=status, type="conflict" if status == 409 else "timeout")
        self.detail = detail


def shown_config(settings: LearnerSettings) -> dict[str, Any]:
    """The settings as TensorBoard / wandb record them: secrets masked (SecretStr dumps as ``**********``; the
    password in ``redis_url`` is masked here)."""
    config = settings.model_dump(mode="json")
    config["redis_url"] = redact_url(config.get("redis_url"))
    return config


class LearnerService:
    def __init__(self, settings: LearnerSettings, on_exit: Callable[[int], None] | None = None) -> None:
        self.settings = settings
        self.on_exit = on_exit
        self.registry = CollectorRegistry()
        self.sink = MetricsSink(settings.observability, Path(settings.run_dir), self.registry,
                                run_name=settings.run_name, config=shown_config(settings))
        self.runner: Runner | None = None
        self.redis: Redis | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.rollout_watch: RolloutWatch | None = None
        self.weights_problem: str | None = None  # replicas behind on weights and why (see _watch_weights)
        self._watch_task: asyncio.Task | None = None
        self.exit_code: int | None = None

    async def start(self) -> None:
        runner_cls = runner_class(self.settings.algorithm)  # what the algorithm registered
        if runner_cls.needs_redis:
            import redis.asyncio as aioredis

            if not self.settings.redis_url:  # the entry point (services/learner/cli.py) starts one when none is given
                raise RuntimeError(f"the {self.settings.algorithm.name} learner needs redis_url (--redis-url, "
                                   "FLEETRL_LEARNER_REDIS_URL, the config file or $REDIS_URL)")
            timeout = max(30.0, self.settings.queue.block_ms / 1000 + 10)
            self.redis = aioredis.from_url(self.settings.redis_url, socket_timeout=timeout, socket_connect_timeout=5)
        self.runner = runner_cls(self.settings, self.redis, self.sink)
        self._task = asyncio.create_task(self._run(), name="learner-run")
        if self.redis is not None:
            self.rollout_watch = RolloutWatch(self.redis, self.settings.run_name, self.settings.rollout.stall_warn_s)
            self._watch_task = asyncio.create_task(self._watch_rollout(), name="learner-rollout-watch")

    async def _watch_rollout(self) -> None:
        """Poll the rollout watch while the run is running (its problem shows in /status and the log)."""
        period = min(2.0, self.settings.rollout.stall_warn_s / 4)
        watch = self.rollout_watch
        assert watch is not None  # start() makes it before this task
        while not self._stop.is_set() and (self._task is None or not self._task.done()):
            if self.runner is not None and self.runner.phase == "running":
                try:
                    await watch.poll()
                    await self._watch_weights()
                except REDIS_FAILED as exc:  # the runner itself waits out Redis outages and says so
                    log.debug("rollout watch: %s", exc)
            await asyncio.sleep(period)

    async def _watch_weights(self) -> None:
        """Replicas behind on weights, and why (failed rounds): the real reason a run stalls, so it is what
        ``/status`` shows as waiting (before the rollout watch's 'workers stopped taking prompts')."""
        problem_of = getattr(self.runner, "weights_problem", None)
        problem = await problem_of() if problem_of is not None else None
        if problem != self.weights_problem:
            if problem:
                log.warning("weights: %s", problem)
            elif self.weights_problem:
                log.info("every replica serves the latest weights again")
            self.weights_problem = problem

    async def _run(self) -> None:
        code = 0
        assert self.runner is not None  # start() makes it before this task
        try:
            await self.runner.run(self._stop)
        except asyncio.CancelledError:
            code = 1
            raise
        except Exception:  # noqa: BLE001 - the runner logged it and holds it in .error; we only set the exit code
            code = 1
        finally:
            self.exit_code = code
            try:
                self.sink.close()
            except Exception:
                log.exception("closing the metrics sink failed")
            if self.settings.exit_when_done and self.on_exit is not None:
                self.on_exit(code)

    async def stop(self, timeout: float = 300.0) -> None:
        """Stop at the next step boundary (checkpointing), then release Redis."""
        self._stop.set()
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        if self._task is not None and not self._task.done():
            done, _ = await asyncio.wait({self._task}, timeout=timeout)
            if not done:
                log.error("the run did not stop within %.0fs; cancelling it", timeout)
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        if self.redis is not None:
            await self.redis.aclose()

    # ---- queries -------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        if self.runner is None:
            return {"phase": "starting"}
        status = {"run_name": self.settings.run_name, **self.runner.status()}
        waiting = self.rollout_watch.problem if self.rollout_watch is not None else None
        if self.weights_problem is not None:
            status["weights_problem"] = self.weights_problem
            if waiting is not None:  # workers hold back because their replica is behind: say so, not that
                waiting = self.weights_problem
        if waiting is not None and status["phase"] == "running":
            status.update(phase="waiting_for_rollout", waiting=waiting)
        return status

    async def health(self) -> tuple[bool, dict[str, Any]]:
        phase = self.runner.phase if self.runner else "starting"
        checks: dict[str, Any] = {"phase": phase}
        ok = phase not in ("failed",)
        if self.redis is not None:
            try:
                await asyncio.wait_for(self.redis.ping(), 2.0)
                checks["redis"] = "ok"
            except REDIS_FAILED as exc:
                checks["redis"] = f"unreachable: {type(exc).__name__}"
                ok = False
            except asyncio.TimeoutError as exc:  # wait_for's (an OSError from 3.11, not on 3.10)
                checks["redis"] = f"unreachable: {type(exc).__name__}"
                ok = False
        if self.runner is not None and self.runner.error:
            checks["error"] = self.runner.error
        return ok, checks

    # ---- control -------------------------------------------------------------------------------------
    async def checkpoint(self, timeout: float = 600.0) -> dict[str, Any]:
        if self.runner is None or self.runner.phase != "running":
            phase = self.runner.phase if self.runner else "starting"
            raise ControlError(409, f"cannot checkpoint while the run is {phase!r}")
        fut = self.runner.request_checkpoint()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError as exc:
            raise ControlError(504, f"no checkpoint within {timeout:.0f}s (a step may still be running)") from exc
        except RuntimeError as exc:
            raise ControlError(409, str(exc)) from exc

    def request_stop(self) -> dict[str, Any]:
        self._stop.set()
        return {"stopping": True, "phase": self.runner.phase if self.runner else "starting"}
