"""Waiting out a Redis outage.

Any Redis error that means "not answering right now" (down, restarting, loading its AOF: ``REDIS_UNAVAILABLE``) makes
the run owner wait and retry with a capped backoff (phase ``waiting_for_redis`` in ``/status``, a log line per
attempt) for up to ``queue.redis_outage_max_s``. Once Redis answers a PING, the owner recovers what an outage can
lose (``recover``: its own pending experiences delivered while the connection broke, prompts the server lost
because they were not persisted before a crash) before it goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from shared.redis_errors import REDIS_UNAVAILABLE, raise_if_refused

log = logging.getLogger(__name__)

FIRST_DELAY_S, MAX_DELAY_S = 0.25, 2.0
"""The backoff between two PINGs: doubled from the first to the cap."""
PING_TIMEOUT_S = 5.0
"""A PING unanswered this long counts as one more failed attempt."""


async def wait_for_redis(redis: Any, exc: BaseException, stop: asyncio.Event, *, max_s: float, error: str,
                         recover: Callable[[], Awaitable[None]], final: bool = False) -> bool:
    """Wait until ``redis`` answers a PING and ``recover()`` ran: True. False when ``stop`` is set first (unless
    ``final``: the run's last steps wait for Redis whatever). Raises RuntimeError (naming ``error``, the outage's
    first error) once ``max_s`` seconds pass."""
    start = time.monotonic()
    delay = FIRST_DELAY_S
    while True:
        waited = time.monotonic() - start
        if waited > max_s:
            raise RuntimeError(f"Redis did not answer for {waited:.0f}s (queue.redis_outage_max_s="
                               f"{max_s:.0f}); last error: {error}") from exc
        log.warning("Redis unavailable (%s: %s); waited %.1fs, retrying in %.1fs", type(exc).__name__, exc,
                    waited, delay)
        if final:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set() and not final:
            return False
        delay = min(delay * 2, MAX_DELAY_S)
        try:
            await asyncio.wait_for(redis.ping(), PING_TIMEOUT_S)
            await recover()
            break
        except REDIS_UNAVAILABLE + (asyncio.TimeoutError,) as again:
            raise_if_refused(again)
            exc = again
    log.info("Redis answers again after %.1fs", time.monotonic() - start)
    return True
