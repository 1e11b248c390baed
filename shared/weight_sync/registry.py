"""Replica membership in Redis: a hash of :class:`ReplicaInfo` plus one expiring heartbeat key each.

A replica is alive while its heartbeat key exists; entries of dead replicas are pruned on read.
"""

from __future__ import annotations

from typing import Any

from shared.weight_sync import keys as wkeys
from shared.weight_sync.wire import ReplicaInfo


class ReplicaRegistry:
    def __init__(self, redis: Any, run: str) -> None:
        self.redis, self.run = redis, run

    async def put(self, info: ReplicaInfo, ttl_s: float) -> None:
        """Register (or update) a replica and refresh its heartbeat."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(wkeys.replicas(self.run), info.replica_id, info.dumps())
        pipe.set(wkeys.alive(self.run, info.replica_id), "1", px=int(ttl_s * 1000))
        await pipe.execute()

    async def heartbeat(self, replica_id: str, ttl_s: float) -> None:
        await self.redis.set(wkeys.alive(self.run, replica_id), "1", px=int(ttl_s * 1000))

    async def remove(self, replica_id: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hdel(wkeys.replicas(self.run), replica_id)
        pipe.delete(wkeys.alive(self.run, replica_id))
        await pipe.execute()

    async def is_alive(self, replica_id: str) -> bool:
        return bool(await self.redis.exists(wkeys.alive(self.run, replica_id)))

    async def alive(self, listing: dict | None = None) -> list[ReplicaInfo]:
        """Registered replicas whose heartbeat is current (dead entries are removed). ``listing``: the
        registry hash as the caller already read it (``HGETALL`` of ``keys.replicas``), to save a round trip."""
        raw = await self.redis.hgetall(wkeys.replicas(self.run)) if listing is None else listing
        if not raw:
            return []
        ids = [k.decode() if isinstance(k, bytes) else k for k in raw]
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.exists(wkeys.alive(self.run, rid))
        flags = await pipe.execute()
        out: list[ReplicaInfo] = []
        dead: list[str] = []
        for rid, ok in zip(ids, flags):
            value = raw[rid.encode()] if rid.encode() in raw else raw[rid]
            if ok:
                out.append(ReplicaInfo.loads(value))
            else:
                dead.append(rid)
        if dead:
            await self.redis.hdel(wkeys.replicas(self.run), *dead)
        return sorted(out, key=lambda i: i.replica_id)
