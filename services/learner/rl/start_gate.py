"""The learner's start gate: load everything, then hold the first publish and step until the launcher says go.

``fleetrl run`` measures the starting policy's held-out accuracy before the learner may move the weights. Rather
than start the learner only after that evaluation (its start-up, the model load and optimizer set-up, then runs
after it), the launcher starts it with ``train.start_gate`` set to a value of this launch and writes that value
to ``keys.learner_start_gate(run)`` when the evaluation is done. A key left by an earlier launch holds another
value, so it never opens this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class StartGateTimeout(RuntimeError):
    """The gate stayed shut for ``train.start_gate_timeout_s``."""


async def wait_start_gate(redis, key: str, value: str, timeout_s: float, stop: asyncio.Event,
                          poll_s: float = 0.05) -> bool:
    """Wait until ``key`` holds ``value``: True when it does, False when ``stop`` is set first. Raises
    ``StartGateTimeout`` after ``timeout_s`` (Redis errors propagate, for the caller's outage handling)."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        got = await asyncio.wait_for(redis.get(key), 10.0)
        if got is not None and (got.decode() if isinstance(got, bytes) else got) == value:
            return True
        if time.monotonic() >= deadline:
            raise StartGateTimeout(
                f"train.start_gate: Redis key {key} did not open within {timeout_s:.0f}s "
                f"(train.start_gate_timeout_s); the launcher that set the gate did not say go")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
    return False


def open_start_gate(redis_url: str, key: str, value: str, timeout_s: float = 10.0) -> None:
    """Say go (the launcher's side): ``key`` holds ``value`` for a day."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        client.set(key, value, ex=86_400)
    finally:
        client.close()
