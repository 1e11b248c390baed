"""Publishes the elastic pool's demand signal every step (``services.learner.pool_signal`` has the formula).

Reads what it needs from Redis in one pipeline plus the weight registry (live replicas), computes the signal,
and writes it to ``shared.keys.pool_signal(run)`` (JSON, expires after ``ttl_s`` so a stopped learner's
signal does not drive a controller) and to the sink's gauges. A Redis error costs this step's signal, never
the step: the caller logs it and carries on.
"""

from __future__ import annotations

import json
import time
from typing import Any

from services.learner.pool_signal import PoolSignal, PoolSignalSettings, PoolWindow, pool_signal
from shared import keys
from shared.weight_sync.registry import ReplicaRegistry

SIGNAL_TTL_S = 600


class PoolWatch:
    def __init__(self, redis: Any, run: str, settings: PoolSignalSettings) -> None:
        self.redis, self.run, self.settings = redis, run, settings
        self.window = PoolWindow(settings.window_steps, warmup=settings.warmup_steps)
        self.registry = ReplicaRegistry(redis, run)
        self.last: PoolSignal | None = None
        self._last_step_end: float | None = None
        self._step: tuple[float, float, int] | None = None  # the step done, added to the window at publish

    def step_done(self, wait_s: float, tokens: int, now: float | None = None) -> None:
        """Record a trained step: its wall time since the previous one, the part spent waiting, tokens trained
        (added to the window by :meth:`publish`, with the live replicas it ended with)."""
        now = time.perf_counter() if now is None else now
        if self._last_step_end is not None:
            self._step = (now - self._last_step_end, wait_s, tokens)
        self._last_step_end = now

    async def publish(self, step: int) -> PoolSignal:
        stream = keys.prompts_stream(self.run)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xpending(stream, "rollout")
        length, pending = await pipe.execute()
        in_flight = int((pending or {}).get("pending", 0) or 0)
        waiting = max(0, int(length) - in_flight)
        replicas = len(await self.registry.alive())
        if self._step is not None:
            self.window.add(*self._step, replicas=replicas, waiting=waiting, in_flight=in_flight)
            self._step = None
        sig = pool_signal(self.window, replicas=replicas, prompts_waiting=waiting, groups_in_flight=in_flight,
                          settings=self.settings)
        record = {**sig.to_dict(), "step": step, "at": time.time()}
        await self.redis.set(keys.pool_signal(self.run), json.dumps(record), ex=SIGNAL_TTL_S)
        self.last = sig
        return sig
