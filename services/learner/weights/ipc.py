"""The ``ipc`` transport, publisher side: replicas on the learner's own GPU take each version device to device.

NCCL never pairs two ranks on one GPU and gloo reads host memory, so a replica that shares the learner's GPU
(the usual single-node setup) gets the buckets by CUDA IPC handle instead, as vLLM's ``ipc`` weight-transfer
engine and verl's colocated mode do:

1. each bucket is held on the GPU for the whole round: the weights' own memory when they were laid out in
   place (:meth:`WeightPublisher.flatten`: nothing is copied), else a GPU copy kept per bucket;
2. each bucket's storage is shared once (:class:`~shared.weight_sync.cuda_ipc.IpcExporter`) and the device is
   synchronised, so the handles show the finished step's weights; every bucket is digested on the GPU;
3. an :class:`~shared.weight_sync.wire.IpcRound` (the handles as validated fields; no pickle) is written and
   announced on the same stream as collective rounds;
4. members open the handles and copy the bytes into their own buffers on the device, then say so (the
   round's ``copied`` list); the publisher waits for every copy (or a failure report, a death, or
   ``load_timeout_s``) before it returns, so the learner does not touch a bucket while a member reads it.
   Members then check the digests and switch to the version on their own, without holding the learner
   (generation is paused only for their switch); one that refuses it asks for it again (catch-up).

Late joiners are brought up between publishes like collective ones (:meth:`CollectiveTransport.catch_up`);
a member that copies while training moves the weights on refuses the torn copy by digest and gets the next
version.
"""

from __future__ import annotations

import asyncio
import time

from services.learner.weights.collective import CollectiveTransport, member_errors
from services.learner.weights.transport import Publisher, PublishFailed, Shipment
from shared.weight_sync import keys as wkeys
from shared.weight_sync.cuda_ipc import IpcExporter
from shared.weight_sync.wire import IpcHandle, IpcRound, ReplicaInfo


class IpcTransport(CollectiveTransport):
    """Rounds by CUDA IPC handle for the replicas that advertise ``ipc`` (see the module docstring)."""

    name = "ipc"
    sends_delta = False
    auto_digest = "wsum64"  # computed on the GPU, where the buckets are shared: nothing copied to the host

    def __init__(self, publisher: Publisher) -> None:
        super().__init__(publisher)
        self.exporter = IpcExporter()

    def serves(self, info: ReplicaInfo) -> bool:
        return info.transport == self.name

    def _export(self) -> list[IpcHandle]:
        """Every bucket on the GPU and shared; the device synchronised so the handles show finished bytes. Then
        every bucket is digested (on the GPU with wsum64)."""
        import torch

        box = self.outbox
        assert box.manifest is not None  # exported within a publish: a version is held
        n = len(box.manifest.buckets)
        bufs = [box.device_copy(i) for i in range(n)]
        for dev in {b.device for b in bufs}:
            torch.cuda.synchronize(dev)
        handles = [self.exporter.export(b) for b in bufs]
        for i in range(n):
            box.digest(i)
        return handles

    async def deliver(self, replicas: list[ReplicaInfo], shipment: Shipment) -> None:
        if not replicas:
            return
        s, manifest, clock, report = self.settings, self.outbox.manifest, shipment.clock, shipment.report
        assert manifest is not None
        try:
            handles = await asyncio.to_thread(self._export)
        except Exception as exc:  # this side could not share its buckets: no member can do better
            raise PublishFailed(f"sharing version {manifest.version}'s buckets by CUDA IPC failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        await self.publisher.write_checksums()
        clock.lap("stage")
        round_id = shipment.take_round_id()
        if round_id is None:
            round_id = await self.redis.incr(wkeys.round_counter(self.run))
        rec = IpcRound(round=int(round_id), version=manifest.version,
                       manifest_key=wkeys.manifest(self.run, manifest.version),
                       members=tuple(i.replica_id for i in replicas), handles=tuple(handles),
                       init_timeout_s=s.init_timeout_s, collective_timeout_s=s.collective_timeout_s,
                       load_timeout_s=s.load_timeout_s, layout_id=manifest.layout_id, checksum=manifest.checksum,
                       created_at=time.time())
        pipe = self.redis.pipeline(transaction=False)
        if shipment.manifest_unwritten:
            shipment.manifest_unwritten = False
            pipe.set(rec.manifest_key, manifest.dumps(), ex=s.key_ttl_s)
        pipe.set(wkeys.ipc_round(self.run), rec.dumps(), ex=s.key_ttl_s)
        pipe.xadd(wkeys.announcements(self.run), {"round": str(rec.round)}, maxlen=64, approximate=True)
        await pipe.execute()
        clock.lap("announce")
        copied = await self._copies(rec.round, replicas, s.load_timeout_s)
        clock.lap("copy")
        rest = [i for i in replicas if i.replica_id not in copied]
        report.rounds += 1
        report.loaded += sorted(copied)  # they verify and switch on their own (a refusal asks again: catch-up)
        if rest:
            out = await self._settle(rec.round, rest, 1.0)  # what those said (failed / refused), if anything
            clock.lap("settle")
            report.loaded += out.loaded
            report.refused += out.refused
            # a member that failed its copy asks again (wants_version) and is caught up between publishes
            report.dropped += out.dropped + [i.replica_id for i in out.retry]
            report.errors += member_errors(out)

    async def _copies(self, round_id: int, members: list[ReplicaInfo], timeout_s: float) -> set[str]:
        """Wait until every member has copied the buckets, reported (a failure), died, or ``timeout_s`` passed;
        the members that copied. Each copy or report wakes the wait (the round's ``reported`` list)."""
        ids = {m.replica_id for m in members}
        key, reports_key = wkeys.copied(self.run, round_id), wkeys.reports(self.run, round_id)
        wake = wkeys.reported(self.run, round_id)
        deadline = time.monotonic() + timeout_s
        next_alive_check = time.monotonic() + 0.5
        dead: set[str] = set()
        while True:
            pipe = self.redis.pipeline(transaction=False)
            pipe.lrange(key, 0, -1)
            pipe.hkeys(reports_key)
            raw_copied, raw_reported = await pipe.execute()
            copied = {x.decode() if isinstance(x, bytes) else x for x in raw_copied} & ids
            reported = {x.decode() if isinstance(x, bytes) else x for x in raw_reported}
            now = time.monotonic()
            if not ids - copied - reported - dead or now >= deadline:
                return copied
            if now >= next_alive_check:
                next_alive_check = now + 0.5
                for rid in ids - copied - reported:
                    if not await self.registry.is_alive(rid):
                        dead.add(rid)
            block = min(deadline, next_alive_check) - time.monotonic()
            if block > 0:
                await self.redis.blpop([wake], timeout=max(0.01, block))

    def close(self) -> None:
        super().close()
        self.exporter.clear()
