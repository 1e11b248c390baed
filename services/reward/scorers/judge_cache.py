"""Judgments kept by key: a bounded in-memory LRU, optionally backed by Redis with a TTL.

A key is the hash of everything that decides a judgment (endpoint, model, system message, template, sampling,
parser, mode, and the judged prompt, response(s) and label): :func:`judgment_key`. Values are a score or a list
of scores, stored as JSON (never pickle). Redis is a help, not a dependency: a Redis call that fails or passes
``redis_timeout_s`` is a miss (or a judgment not stored), logged once per outage, never a scoring failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from typing import Any

from cachetools import LRUCache

log = logging.getLogger("fleetrl.reward.judge")

Judgment = float | list[float]


def judgment_key(identity: str, *parts: Any) -> str:
    """sha256 of the judge's identity (its settings that decide a judgment) and the judged data."""
    h = hashlib.sha256(identity.encode())
    h.update(json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _valid(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_valid(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class JudgmentCache:
    """``get(key)`` / ``put(key, value)``; the LRU first, then Redis when configured."""

    def __init__(self, config):
        self.config = config
        self._lru: LRUCache | None = LRUCache(maxsize=config.size) if config.size else None
        self._redis = None
        self._redis_down = False

    async def start(self) -> None:
        if self.config.redis_url is not None:
            import redis.asyncio as aioredis

            t = self.config.redis_timeout_s
            self._redis = aioredis.from_url(self.config.redis_url.get_secret_value(), socket_timeout=t,
                                            socket_connect_timeout=t)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    @property
    def enabled(self) -> bool:
        return self._lru is not None or self._redis is not None

    async def get(self, key: str) -> Judgment | None:
        if self._lru is not None and key in self._lru:
            return self._lru[key]
        if self._redis is None:
            return None
        raw = await self._redis_call(self._redis.get(self.config.prefix + key))
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        if not _valid(value):  # whatever else sits in Redis under our prefix is not a judgment
            return None
        if self._lru is not None:
            self._lru[key] = value
        return value

    async def put(self, key: str, value: Judgment) -> None:
        if self._lru is not None:
            self._lru[key] = value
        if self._redis is not None:
            await self._redis_call(self._redis.set(self.config.prefix + key, json.dumps(value),
                                                   px=int(self.config.ttl_s * 1000)))

    async def _redis_call(self, call) -> Any:
        try:
            result = await asyncio.wait_for(call, self.config.redis_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the cache is a help: a miss, said once per outage
            if not self._redis_down:
                log.warning("judge cache: Redis failed (%s: %s); judging without it until it answers",
                            type(exc).__name__, exc)
            self._redis_down = True
            return None
        if self._redis_down:
            log.info("judge cache: Redis answers again")
        self._redis_down = False
        return result
