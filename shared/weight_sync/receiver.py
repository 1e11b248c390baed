"""Replica side of the protocol, engine-agnostic: find the rounds a replica is in, read manifests, report
results, and (for engines whose sidecar receives the bytes itself) receive and verify a version's buckets.

    watcher = RoundWatcher(redis, run, replica_id)
    rdv, member = await watcher.next_round()           # a round that names this replica
    manifest = await watcher.manifest(rdv)
    buffers = BucketReceiver().receive(rdv, member, manifest)   # blocking: run it in a thread
    await watcher.report(rdv, "loaded")                # or "failed" (alive, round broke) / "refused" (bad data)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shared.weight_sync import keys as wkeys
from shared.weight_sync.wire import Manifest, Member, MemberReport, Rendezvous, ReportState

log = logging.getLogger(__name__)


class RoundFailed(RuntimeError):
    """The round broke (a peer died, a timeout): the replica is alive and can take part in a retry."""


class UpdateRefused(RuntimeError):
    """The data is wrong (checksum, names, shapes): the replica keeps its current version."""


class RoundWatcher:
    def __init__(self, redis: Any, run: str, replica_id: str, poll_s: float = 0.05) -> None:
        self.redis, self.run, self.replica_id, self.poll_s = redis, run, replica_id, poll_s
        self.last_round = 0

    async def current(self) -> tuple[Rendezvous, Member] | None:
        """The newest round naming this replica that it has not handled yet, if any."""
        raw = await self.redis.get(wkeys.rendezvous(self.run))
        if raw is None:
            return None
        rdv = Rendezvous.loads(raw)
        if rdv.round <= self.last_round:
            return None
        member = rdv.member(self.replica_id)
        if member is None:
            return None
        self.last_round = rdv.round
        return rdv, member

    async def next_round(self) -> tuple[Rendezvous, Member]:
        while True:
            found = await self.current()
            if found is not None:
                return found
            await asyncio.sleep(self.poll_s)

    async def manifest(self, rdv: Rendezvous) -> Manifest:
        raw = await self.redis.get(rdv.manifest_key)
        if raw is None:
            raise RoundFailed(f"manifest {rdv.manifest_key} is gone")
        return Manifest.loads(raw)

    async def latest_manifest(self, version: int) -> Manifest | None:
        raw = await self.redis.get(wkeys.manifest(self.run, version))
        return None if raw is None else Manifest.loads(raw)

    async def report(self, rdv: Rendezvous, state: ReportState, detail: str = "") -> None:
        r = MemberReport(replica_id=self.replica_id, round=rdv.round, version=rdv.version, state=state,
                         detail=detail[:2000])
        key = wkeys.reports(self.run, rdv.round)
        await self.redis.hset(key, self.replica_id, r.dumps())
        await self.redis.expire(key, 24 * 3600)


class BucketReceiver:
    """Receives a version's buckets into staging buffers over the round's group, and verifies them.

    Holds the group between rounds so that the publisher can reuse it; a round with a new group name
    closes the old group and forms the new one."""

    def __init__(self, device: Any = "cpu", keep_staging: bool = False) -> None:
        self.device = device
        self.group: Any = None
        self.keep_staging = keep_staging
        self._kept: tuple[list, list] | None = None  # (bucket layouts, buffers) of the last round

    def receive(self, rdv: Rendezvous, member: Member, manifest: Manifest) -> list[Any]:
        """Join (or reuse) the group, receive every bucket, verify checksums. Blocking.

        Raises :class:`RoundFailed` if the group or a broadcast fails, :class:`UpdateRefused` if a bucket
        does not match its checksum."""
        import torch

        from shared.weight_sync import tensors as T
        from shared.weight_sync.group import CollectiveError, CollectiveGroup

        if self.group is not None and (self.group.name != rdv.group_name or self.group.broken):
            self.close()
        if self.group is None:
            if not rdv.fresh_group:
                raise RoundFailed(f"round {rdv.round} reuses group {rdv.group_name}, which this replica does not hold")
            try:
                self.group = CollectiveGroup.open(
                    backend=rdv.backend, master_addr=rdv.master_addr, master_port=rdv.master_port,
                    rank=member.rank, world_size=rdv.world_size, group_name=rdv.group_name,
                    init_timeout_s=rdv.init_timeout_s, collective_timeout_s=rdv.collective_timeout_s)
            except CollectiveError as exc:
                raise RoundFailed(str(exc)) from exc
        group = self.group
        try:
            layout = [b.tensors for b in manifest.buckets]
            if self._kept is not None and self._kept[0] == layout:
                buffers = self._kept[1]
            else:
                self._kept = None
                buffers = [torch.empty(b.nbytes, dtype=torch.uint8, device=self.device) for b in manifest.buckets]
            if self.keep_staging:
                self._kept = (layout, buffers)
            works = [group.broadcast(buf, src=0) for buf in buffers]
            bad = []
            for b, buf, work in zip(manifest.buckets, buffers, works):
                group.wait(work)
                if b.checksum is not None and T.checksum(buf) != b.checksum:
                    bad.append(b.index)
        except CollectiveError as exc:
            self.close()
            raise RoundFailed(str(exc)) from exc
        if bad:
            raise UpdateRefused(f"version {manifest.version}: bucket(s) {bad} failed the checksum")
        return buffers

    def close(self) -> None:
        self._kept = None
        if self.group is not None:
            self.group.close()
            self.group = None
