"""Which rollout replica holds which session, in Redis, so that a call landing on another replica (a load
balancer in front of several) reaches the session's owner instead of a bare 404.

A session lives in the memory of the replica that opened it. Each replica in session mode

- advertises the URL others reach it at (``advertise_url``; default ``http://<host>:<port>``, with a
  wildcard host the address of the machine's hostname: a container's or pod's IP; see :func:`default_url`),
- registers each session it opens: ``fleetrl:<run>:sessions:<id>`` -> that URL (``SET NX``: an id is unique
  in the fleet), expiring with the session's idle expiry (refreshed by the sweeper, which also refreshes
  the replica's heartbeat ``fleetrl:<run>:rollout:replica:<url>``),
- replaces it, when the session ends, by how it ended (``finished`` / ``deleted`` / ``expired``), kept for
  ``ttl_s``, so that every replica answers a late call as the owner would (409 / 404 "expired").

A replica asked about a session it does not hold looks it up here (:meth:`SessionManager.locate`): held by
another live replica -> :class:`SessionElsewhere` (a 307 to the same path there; lifecycle routes forward
the request instead, since clients drop the bearer token on a redirect to another host); ended -> the
owner's answer; unknown, or held by a replica that is gone -> 404. "Gone" is a heartbeat that expired, or one
that has not expired yet but whose replica refuses connections (SIGKILLed moments ago: :class:`OwnerProbe`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import httpx
import redis.asyncio as aioredis

from shared import keys
from shared.advertise import default_url
from shared.service_kit.errors import ServiceError

ENDED = ("finished", "deleted", "expired")
FORWARDED_HEADER = "X-FleetRL-Forwarded-By"
"""Set on a lifecycle request one replica forwards to a session's owner (the forwarder's URL): never forwarded
again."""


class SessionElsewhere(ServiceError):
    """The session is held by another live replica: 307 to the same path and query there (the app's handler
    adds ``Location``)."""

    status = 307
    type = "session_elsewhere"

    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(f"session {session_id!r} is held by the rollout replica at {owner}: send its calls there "
                         "(the redirect's Location; POST /sessions answers it as replica_url)",
                         headers={"X-Session-Replica": owner})
        self.session_id = session_id
        self.owner = owner


def url_of_socket(host: str, scope: Mapping[str, Any]) -> str | None:
    """The replica's URL from the socket a request came in on (``port: 0``: the port the server bound)."""
    server = scope.get("server")
    if not server or not server[1]:
        return None
    return default_url(host, int(server[1]))


class SessionRegistry:
    """The Redis side: owner keys and the replica's heartbeat (every call may raise Redis' errors)."""

    def __init__(self, redis: aioredis.Redis, run: str, ttl_s: float, sweep_interval_s: float) -> None:
        self.redis = redis
        self.run = run
        self.ttl_s = ttl_s
        self.margin_s = 2 * sweep_interval_s + 5  # an owner key outlives the session's local expiry by this
        self.heartbeat_s = max(15, math.ceil(3 * sweep_interval_s))

    def _key(self, sid: str) -> str:
        return keys.session_owner(self.run, sid)

    async def claim(self, sid: str, url: str) -> str | None:
        """Register ``sid`` as held at ``url``; None if done, else what the key holds (an owner or how it ended)."""
        for _ in range(3):
            if await self.redis.set(self._key(sid), url, nx=True, ex=math.ceil(self.ttl_s + self.margin_s)):
                return None
            held = await self.redis.get(self._key(sid))
            if held is not None:
                return held.decode() if isinstance(held, bytes) else held
        return "unknown"  # set and gone three times in a row: cannot happen unless the key churns

    async def refresh(self, url: str, open_sessions: list[tuple[str, float]]) -> None:
        """The heartbeat, and each open session's key expiring ``margin_s`` after its local idle expiry."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(keys.rollout_replica(self.run, url), "1", ex=self.heartbeat_s)
        for sid, expires_in in open_sessions:
            pipe.expire(self._key(sid), math.ceil(expires_in + self.margin_s))
        await pipe.execute()

    async def beat(self, url: str) -> None:
        await self.redis.set(keys.rollout_replica(self.run, url), "1", ex=self.heartbeat_s)

    async def leave(self, url: str) -> None:
        await self.redis.delete(keys.rollout_replica(self.run, url))

    async def ended(self, sid: str, how: str) -> None:
        await self.redis.set(self._key(sid), how, ex=math.ceil(self.ttl_s))

    async def discard(self, sid: str) -> None:
        await self.redis.delete(self._key(sid))

    async def lookup(self, sid: str) -> tuple[str | None, bool]:
        """(the owner URL or how the session ended, or None; whether that owner's heartbeat is alive)."""
        held = await self.redis.get(self._key(sid))
        if held is None:
            return None, False
        value = held.decode() if isinstance(held, bytes) else held
        if value in ENDED:
            return value, False
        return value, bool(await self.redis.exists(keys.rollout_replica(self.run, value)))


class OwnerProbe:
    """Whether a session's owner still listens, asked before sending a call there: a replica SIGKILLed moments
    ago keeps its heartbeat for up to its TTL, and a redirect to its closed port helps nobody. A refused
    connection is gone; an owner that is slow or busy (a timeout, an error status) counts as there. Answers are
    kept ``keep_s`` per owner, so a burst of misrouted calls costs one probe."""

    def __init__(self, http: httpx.AsyncClient, timeout_s: float = 2.0, keep_s: float = 2.0) -> None:
        self.http = http
        self.timeout_s = timeout_s
        self.keep_s = keep_s
        self._seen: dict[str, tuple[float, bool]] = {}

    async def answers(self, owner: str) -> bool:
        now = time.monotonic()
        seen = self._seen.get(owner)
        if seen is not None and now - seen[0] < self.keep_s:
            return seen[1]
        try:
            await self.http.get(f"{owner}/health", timeout=self.timeout_s)
            ok = True
        except httpx.ConnectError:
            ok = False
        except httpx.HTTPError:
            ok = True
        if len(self._seen) > 1024:
            self._seen.clear()
        self._seen[owner] = (now, ok)
        return ok
