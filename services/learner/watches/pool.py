"""Publishes the elastic pool's demand signal every step (``services.learner.watches.pool_signal`` has the formula).

While the learner waits for experiences it samples the prompts stream (:meth:`PoolWatch.sample_wait`: prompts
waiting for a replica, groups held by one), each sample weighted by the wait it ends, so a step's backlog is what
waited for a replica *while the learner waited* (at the step's end the next step's prompts are not fed yet, so a
sample then says little). At the step's end it reads the stream once more (one pipeline) and the weight registry
(live replicas), computes the signal,
and writes it to ``shared.keys.pool_signal(run)`` (JSON, expires after ``ttl_s`` so a stopped learner's
signal does not drive a controller) and to the sink's gauges. A Redis error costs this step's signal, never
the step: the caller logs it and carries on.
"""

from __future__ import annotations

import json
import time
from typing import Any

from services.learner.watches.pool_signal import PoolSignal, PoolSignalSettings, PoolWindow, pool_signal
from shared import keys
from shared.weight_sync.registry import ReplicaRegistry

SIGNAL_TTL_S = 600
SAMPLE_EVERY_S = 0.02  # at most one stream sample per this while the learner waits (a wait's samples are merged)


class PoolWatch:
    def __init__(self, redis: Any, run: str, settings: PoolSignalSettings) -> None:
        self.redis, self.run, self.settings = redis, run, settings
        self.window = PoolWindow(settings.window_steps, warmup=settings.warmup_steps)
        self.registry = ReplicaRegistry(redis, run)
        self.last: PoolSignal | None = None
        self._last_step_end: float | None = None
        self._step: tuple[float, float, int] | None = None  # the step done, added to the window at publish
        # this step's stream samples while the learner waited: sum of waiting * weight, held * weight, weights
        self._q_sum = self._held_sum = self._weight = self._unsampled = 0.0
        self._last_sample: float | None = None
        self._step_queue: tuple[float, float] | None = None  # the step done's (waiting, held) while it waited

    async def _queue(self) -> tuple[int, int]:
        """(prompts waiting for a replica, groups held by one) in the prompts stream now."""
        stream = keys.prompts_stream(self.run)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xpending(stream, "rollout")
        length, pending = await pipe.execute()
        in_flight = int((pending or {}).get("pending", 0) or 0)
        return max(0, int(length) - in_flight), in_flight

    async def sample_wait(self, waited_s: float, now: float | None = None) -> None:
        """The learner just waited ``waited_s`` for experiences: sample the stream, weighted by that wait (samples
        closer than ``SAMPLE_EVERY_S`` are merged into the next one)."""
        now = time.perf_counter() if now is None else now
        self._unsampled += max(0.0, waited_s)
        if self._last_sample is not None and now - self._last_sample < SAMPLE_EVERY_S:
            return
        self._last_sample = now
        waiting, held = await self._queue()
        self._q_sum += waiting * self._unsampled
        self._held_sum += held * self._unsampled
        self._weight += self._unsampled
        self._unsampled = 0.0

    def step_done(self, wait_s: float, tokens: int, now: float | None = None) -> None:
        """Record a trained step: its wall time since the previous one, the part spent waiting, tokens trained
        (added to the window by :meth:`publish`, with the live replicas it ended with and its stream samples)."""
        now = time.perf_counter() if now is None else now
        if self._last_step_end is not None:
            self._step = (now - self._last_step_end, wait_s, tokens)
        self._last_step_end = now
        w = self._weight
        self._step_queue = (self._q_sum / w, self._held_sum / w) if w > 0 else None
        self._q_sum = self._held_sum = self._weight = self._unsampled = 0.0

    async def publish(self, step: int) -> PoolSignal:
        waiting, in_flight = await self._queue()
        replicas = len(await self.registry.alive())
        if self._step is not None:
            # the step's stream while the learner waited; a step without a sampled wait: the stream now
            q, held = self._step_queue if self._step_queue is not None else (waiting, in_flight)
            self.window.add(*self._step, replicas=replicas, waiting=q, in_flight=held)
            self._step = None
        sig = pool_signal(self.window, replicas=replicas, prompts_waiting=waiting, groups_in_flight=in_flight,
                          settings=self.settings)
        record = {**sig.to_dict(), "step": step, "at": time.time()}
        await self.redis.set(keys.pool_signal(self.run), json.dumps(record), ex=SIGNAL_TTL_S)
        self.last = sig
        return sig
