"""The collective transport, publisher side: update rounds in a broadcast group the publisher forms as rank 0.

For each group kind the live replicas advertise (``torch``: FleetRL's hf sidecar and SGLang servers;
``pynccl``: vLLM servers), a round writes the manifest (JSON; in the same round trip, just before the first
round's rendezvous) and a :class:`Rendezvous`, forms (or reuses) the group, and broadcasts each bucket once,
taking its bytes from the outbox while the previous buckets are still on the wire (a pipeline: at most
``inflight_buckets`` broadcasts outstanding), digesting each once its broadcast is under way. After the last
digest the :class:`Checksums` record is written; then each member's report is collected. A round that breaks
(a member died or hung) is abandoned: survivors report ``failed`` and the next round re-runs the version
with them in a fresh group; members that never report are dropped. The group is kept for the next version
while its members stay the same.

Between publishes, :meth:`CollectiveTransport.catch_up` brings replicas that join later (or were dropped) to
the version held, in a group of their own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from services.learner.weights.transport import (
    Publisher,
    PublishFailed,
    PublishReport,
    Shipment,
    WeightTransport,
)
from shared.weight_sync import keys as wkeys
from shared.weight_sync import net
from shared.weight_sync.group import open_group
from shared.weight_sync.phases import PhaseClock
from shared.weight_sync.wire import Member, MemberReport, Rendezvous, ReplicaInfo

log = logging.getLogger(__name__)


@dataclass
class _Outcome:
    loaded: list[str]
    refused: list[str]
    retry: list[ReplicaInfo]
    dropped: list[str]
    error: str = ""
    details: dict[str, str] | None = None  # what each member that did not load said
    resend: list[ReplicaInfo] | None = None  # refused a delta round: sent whole next (no group change needed)
    seconds: float = 0.0  # the round on the learner's critical path, forming a group aside (RoundChooser's measure)
    kind: str = "full"  # what the round sent: full, delta or adapter


def member_errors(out: _Outcome) -> list[str]:
    """One line per member that refused or failed a round, with what it said (for the publish report)."""
    details = out.details or {}
    return [f"{rid} {state}: {details.get(rid) or 'no detail'}"
            for state, ids in (("refused the round", out.refused),
                               ("failed the round", [i.replica_id for i in out.retry]),
                               ("refused the delta round (sent whole next)",
                                [i.replica_id for i in out.resend or []]))
            for rid in ids]


@dataclass
class _HeldGroup:
    group: Any
    rendezvous: Rendezvous


def patch_tensor(data: Any, backend: str) -> Any:
    """A patch's bytes (a uint8 numpy array, :class:`~shared.weight_sync.delta.Patch`) as a uint8 tensor where
    ``backend`` sends from: the array itself for gloo (no copy), the current GPU for nccl."""
    import numpy as np
    import torch

    arr = data if isinstance(data, np.ndarray) else np.frombuffer(bytearray(data), dtype=np.uint8)
    t = torch.from_numpy(arr)
    if backend == "nccl":
        t = t.to(torch.device("cuda", torch.cuda.current_device()))
    return t


def group_name_for(master_port: int) -> str:
    """A group's name follows from its rendezvous port, so an engine whose init call carries no group name
    (vLLM's ``init_info``) can still name it. No two groups held at once share a port; a later group may
    reuse one (a fixed ``rendezvous_port``), so members go by ``Rendezvous.fresh_group``, not by the name."""
    return f"fleetrl-weights-{master_port}"


class CollectiveTransport(WeightTransport):
    """Rounds in a broadcast group, for the replicas that advertise ``collective`` on the publisher's backend."""

    name = "collective"
    sends_delta = True

    def __init__(self, publisher: Publisher) -> None:
        super().__init__(publisher)
        self.held: dict[str, _HeldGroup] = {}  # group kind -> the group kept for the next version
        self._catch_up_tries: Counter[tuple[str, int]] = Counter()

    def serves(self, info: ReplicaInfo) -> bool:
        """Does this transport bring ``info`` its versions?"""
        return info.transport == self.name and info.backend == self.settings.backend

    async def deliver(self, replicas: list[ReplicaInfo], shipment: Shipment) -> None:
        """Bring the replicas that run this publisher's backend to the version held: one series of rounds per
        group kind (replicas of different kinds cannot share a group; e.g. vLLM servers join a PyNccl group),
        one kind after the other."""
        assert self.outbox.manifest is not None
        report, main = shipment.report, shipment.main
        by_kind: dict[str, list[ReplicaInfo]] = {}
        adapter = self.outbox.manifest.adapter is not None  # adapter rounds: every sidecar receives them itself
        for t in replicas:
            if t.backend == self.settings.backend:
                by_kind.setdefault("torch" if adapter else t.group, []).append(t)
        for kind, remaining in by_kind.items():
            # the rounds that brought the version to this kind's members, for delta: auto (RoundChooser): the first
            # round's kind and the time it took, plus a resend's (members refused the delta round: that is what the
            # delta round cost); rounds that failed or dropped a member are no measure of either kind
            measuring, spent = None if adapter or not main or kind != "torch" else "", 0.0
            for _ in range(self.settings.max_attempts):
                if not remaining:
                    break
                out = await self._round(remaining, shipment, kind)
                if measuring is not None:
                    measuring, spent = measuring or out.kind, spent + out.seconds
                    if out.retry or out.dropped or out.refused:
                        measuring = None
                    elif not out.resend:
                        self.publisher.delta.chooser.record(measuring, spent, self.outbox.manifest.total_bytes)
                        measuring = None
                report.rounds += 1
                report.loaded += out.loaded
                report.refused += out.refused
                report.dropped += out.dropped
                if out.error:
                    report.errors.append(out.error)
                report.errors += member_errors(out)
                remaining = out.retry + (out.resend or [])
            report.dropped += [i.replica_id for i in remaining]
        if main:  # kinds with no member left: their held groups are of no use any more
            for kind in [k for k in self.held if k not in by_kind]:
                self._drop_group(kind)

    async def _round(self, members: list[ReplicaInfo], shipment: Shipment, kind: str) -> _Outcome:
        """One update round for ``members``. Its outcome says what the round took on the learner's critical path
        (``seconds``: from the announcement, or from the group formed when the round forms one, to the last member's
        report) and what it sent (``kind``), which :meth:`deliver` gives the delta chooser."""
        s, manifest, main, clock = self.settings, self.outbox.manifest, shipment.main, shipment.clock
        round_id = shipment.take_round_id()
        if round_id is None:
            round_id = await self.redis.incr(wkeys.round_counter(self.run))
        round_id = int(round_id)
        ids = [m.replica_id for m in members]
        delta = self.publisher.delta
        plan = shipment.delta if main and kind == "torch" and delta.eligible(members) else None
        assert manifest is not None  # deliver() runs with a version held
        held = self.held.get(kind) if main else None
        if held is not None and (held.group.broken or [m.replica_id for m in held.rendezvous.members] != ids):
            held = None  # broken, or other members: not reused
        if main and held is None:
            self._drop_group(kind)
        listener = None  # the new group's rendezvous socket, bound before the rendezvous names its port
        if held is not None:
            base = held.rendezvous
            rdv = base.model_copy(update={"round": round_id, "version": manifest.version, "fresh_group": False,
                                          "manifest_key": wkeys.manifest(self.run, manifest.version),
                                          "layout_id": manifest.layout_id, "checksum": manifest.checksum,
                                          "delta": None if plan is None else plan.record(),
                                          "merged_adapter": manifest.merged_adapter is not None,
                                          "created_at": time.time()})
        else:
            placed, rank = [], 1
            for m in members:
                ranks = 1 if manifest.adapter is not None else m.ranks  # an adapter: the sidecar alone receives it
                placed.append(Member(replica_id=m.replica_id, rank=rank, ranks=ranks))
                rank += ranks
            listener = net.listen(s.listen_addr, s.rendezvous_port, s.rendezvous_ports)
            port = listener.getsockname()[1]
            rdv = Rendezvous(
                round=round_id, version=manifest.version, manifest_key=wkeys.manifest(self.run, manifest.version),
                group_name=group_name_for(port), fresh_group=True, backend=s.backend, group=kind,
                master_addr=s.master_addr, master_port=port, world_size=rank,
                members=tuple(placed), init_timeout_s=s.init_timeout_s,
                collective_timeout_s=s.collective_timeout_s, load_timeout_s=s.load_timeout_s,
                layout_id=manifest.layout_id, checksum=manifest.checksum,
                delta=None if plan is None else plan.record(), merged_adapter=manifest.merged_adapter is not None,
            )
        # the manifest (~100 bytes a tensor) goes before the rendezvous that names it, unless every member
        # already holds its layout (same group, same layout as its last round): members then rebuild it from
        # the rendezvous, and it is written while the first bucket is on its way
        late_manifest, write_late = None, False
        pipe = self.redis.pipeline(transaction=False)
        if shipment.manifest_unwritten:
            shipment.manifest_unwritten = False
            write_late = (held is not None and held.rendezvous.layout_id == manifest.layout_id
                          and not rdv.merged_adapter)
            if not write_late:
                pipe.set(rdv.manifest_key, manifest.dumps(), ex=s.key_ttl_s)
        pipe.set(wkeys.rendezvous(self.run), rdv.dumps(), ex=s.key_ttl_s)
        pipe.xadd(wkeys.announcements(self.run), {"round": str(round_id)}, maxlen=64, approximate=True)
        try:
            await pipe.execute()
        except BaseException:
            if listener is not None:
                listener.close()
            raise
        if write_late:
            late_manifest = asyncio.ensure_future(self.redis.set(rdv.manifest_key, manifest.dumps(), ex=s.key_ttl_s))
        clock.lap("announce")
        started = time.perf_counter()  # the round's time for the chooser (forming a group is not the kind's cost)
        group: Any = held.group if held is not None else None
        try:
            if group is None:
                group = await asyncio.to_thread(
                    open_group, kind, backend=rdv.backend, master_addr=rdv.master_addr,
                    master_port=rdv.master_port, rank=0, world_size=rdv.world_size, group_name=rdv.group_name,
                    init_timeout_s=rdv.init_timeout_s, collective_timeout_s=rdv.collective_timeout_s,
                    listener=listener, gloo_addr=s.gloo_addr)
                clock.lap("group")
                started = time.perf_counter()
            sent = await self._send(group, plan)
            kind_sent = "delta" if plan is not None else "adapter" if manifest.adapter is not None else "full"
            shipment.report.round_bytes[kind_sent] = shipment.report.round_bytes.get(kind_sent, 0) + sent
            if plan is not None:
                shipment.sent_delta = True
                shipment.report.changed_fraction = round(plan.changed_fraction, 6)
                # the sizes each bucket went as, for fleetrl weights status (members read them in band)
                done = rdv.model_copy(update={"delta": plan.record(done=True)})
                await self.redis.set(wkeys.rendezvous(self.run), done.dumps(), ex=s.key_ttl_s)
            if late_manifest is not None:
                await late_manifest
            clock.lap("send")
        except Exception as exc:
            clock.lap("send")  # (up to the failure)
            if listener is not None:
                listener.close()  # unless the store took it over (then this is a no-op)
            if late_manifest is not None:
                await asyncio.gather(late_manifest, return_exceptions=True)
            log.warning("round %d (version %d, members %s) broke: %s", round_id, manifest.version, ids, exc)
            if group is not None:
                group.broken = True
                group.close()  # drops its work handles: our connections close, members relying on them fail now
            if main:
                self.held.pop(kind, None)
            await self._abandon(round_id)
            if isinstance(exc, PublishFailed):  # the publisher's own side failed: no retry would do better
                raise
            # told, the survivors leave the round and report at once; the bound is for those that cannot hear it (a
            # member still forming the group, an engine server in its own collective): their collective timeout
            broke = await self._settle(round_id, members, s.collective_timeout_s + s.regroup_timeout_s,
                                       error=str(exc))
            clock.lap("settle")
            return broke
        if main:
            self.held[kind] = _HeldGroup(group, rdv)
        else:
            group.close()
        out = await self._settle(round_id, members, s.load_timeout_s)
        clock.lap("settle")
        out.seconds, out.kind = time.perf_counter() - started, kind_sent
        delta.confirmed(out.loaded, manifest.version)
        if plan is not None and out.refused:  # a patch did not give the version's bytes: send them whole
            delta.refused(out.refused)
            out.resend = [i for i in members if i.replica_id in out.refused]
            log.warning("round %d: %s refused the delta round (%s): sending version %d whole", round_id,
                        out.refused, "; ".join(f"{r}: {(out.details or {}).get(r, '')}" for r in out.refused),
                        manifest.version)
            out.refused = []
        if main and (out.dropped or out.retry or out.resend):
            self._drop_group(kind)  # membership changed: the next round forms a new group
        return out

    async def _send(self, group: Any, plan: Any = None) -> int:
        """Broadcast every bucket from rank 0, packing bucket k+1 while bucket k is on the wire (at most
        ``inflight_buckets`` outstanding). Each bucket is digested while its broadcast is under way (digests
        never hold bytes back), and the checksums record is written as soon as the last digest is done:
        usually before the replicas, which digest what they received, come to read it (they wait for it,
        bounded by the collective timeout). With a delta ``plan`` (:meth:`_send_delta`), a bucket goes as its
        patch, whole, or not at all. Returns the bytes sent."""
        if plan is not None:
            return await self._send_delta(group, plan)
        manifest = self.outbox.manifest
        assert manifest is not None  # sent within a round: a version is held
        n = len(manifest.buckets)
        pending: deque[Any] = deque()
        sent = 0
        for i in range(n):
            wire = await self._staged(i)
            sent += wire.numel()
            pending.append(group.broadcast(wire, src=0))
            await asyncio.to_thread(self.outbox.digest, i)
            if i == n - 1:
                await self.publisher.write_checksums()
            while len(pending) > self.settings.inflight_buckets:
                await asyncio.to_thread(group.wait, pending.popleft())
        while pending:
            await asyncio.to_thread(group.wait, pending.popleft())
        return sent

    async def _staged(self, i: int) -> Any:
        """Bucket ``i``'s bytes where the backend sends from (a local failure, not the round's)."""
        try:
            return await asyncio.to_thread(self.outbox.wire_buffer, i)
        except Exception as exc:
            raise PublishFailed(f"staging bucket {i} for {self.settings.backend} failed: "
                                f"{type(exc).__name__}: {exc}") from exc

    async def _send_delta(self, group: Any, plan: Any) -> int:
        """A delta round's broadcasts, pipelined by piece (``plan.pieces``: buckets cut every ``piece_bytes``): each
        piece's patch is built (its bucket packed, compared with the base, encoded: :meth:`DeltaBase.build`) while
        the piece before it is on the wire and the members patch it; then its size goes out (one int64: -1 whole,
        0 unchanged, n a patch of n bytes), then the patch or the piece; a bucket is digested once its last piece
        went (the digests are of the full version: every member checks its patched bytes against them). Returns
        the bytes sent (the sizes not counted)."""
        import torch

        delta, backend = self.publisher.delta, self.settings.backend
        manifest = self.outbox.manifest
        assert manifest is not None  # sent within a round: a version is held
        buckets = manifest.buckets
        pending: deque[Any] = deque()
        staged: dict[int, Any] = {}
        sent = 0
        for j, (i, lo, hi) in enumerate(plan.pieces):
            try:
                patch = await asyncio.to_thread(delta.build, self.outbox, plan, j)
            except Exception as exc:
                raise PublishFailed(f"building bucket {i}'s patch failed: {type(exc).__name__}: {exc}") from exc
            size = plan.sent(j)
            if size > 0:
                wire = patch_tensor(patch.data, backend)
            elif size < 0:
                if i not in staged:
                    staged[i] = await self._staged(i)
                wire = staged[i][lo:hi]
            head = torch.tensor([size], dtype=torch.int64)
            if backend == "nccl":
                head = head.to(torch.device("cuda", torch.cuda.current_device()))
            pending.append((group.broadcast(head, src=0), head))
            if size:
                sent += wire.numel()
                pending.append((group.broadcast(wire, src=0), wire))
            if hi == buckets[i].nbytes:  # the bucket's last piece
                staged.pop(i, None)
                await asyncio.to_thread(self.outbox.digest, i)
                if i == len(buckets) - 1:
                    await self.publisher.write_checksums()
            while len(pending) > 2 * self.settings.inflight_buckets:
                await asyncio.to_thread(group.wait, pending.popleft()[0])
        while pending:
            await asyncio.to_thread(group.wait, pending.popleft()[0])
        return sent

    async def _abandon(self, round_id: int) -> None:
        """Tell the round's members it is over (``wkeys.abandoned``): each leaves its collectives and reports within
        a fraction of a second, instead of sitting out its collective timeout (a hung member's own connections stay
        open, so the members it relays to never see a closed socket)."""
        try:
            await self.redis.set(wkeys.abandoned(self.run, round_id), "1", ex=self.settings.key_ttl_s)
        except Exception as exc:  # noqa: BLE001 - the members then leave on their own collective timeout
            log.warning("marking round %d abandoned failed: %s", round_id, exc)

    async def _settle(self, round_id: int, members: list[ReplicaInfo], timeout_s: float, error: str = "") -> _Outcome:
        """Collect members' reports for a round until all reported, died, or ``timeout_s`` passed. Between
        reads it blocks on the round's ``reported`` list, which every report pushes to: it wakes as soon as a
        member reports (the bound on each block only paces the liveness checks)."""
        key, wake = wkeys.reports(self.run, round_id), wkeys.reported(self.run, round_id)
        by_id = {m.replica_id: m for m in members}
        reports: dict[str, MemberReport] = {}
        start = time.monotonic()
        deadline = start + timeout_s
        dead: set[str] = set()
        next_alive_check = start + 0.5
        while True:
            raw = await self.redis.hgetall(key)
            for value in raw.values():
                r = MemberReport.loads(value)
                if r.replica_id in by_id:
                    reports[r.replica_id] = r
            waiting = [rid for rid in by_id if rid not in reports and rid not in dead]
            now = time.monotonic()
            if not waiting or now >= deadline:
                break
            if now >= next_alive_check:
                next_alive_check = now + 0.5
                for rid in waiting:
                    if not await self.registry.is_alive(rid):
                        dead.add(rid)
            block = min(deadline, next_alive_check) - time.monotonic()
            if block > 0:
                await self.redis.blpop([wake], timeout=max(0.01, block))
        pipe = self.redis.pipeline(transaction=False)
        pipe.expire(key, self.settings.key_ttl_s)
        pipe.delete(wake)
        await pipe.execute()
        return _Outcome(
            loaded=[rid for rid, r in reports.items() if r.state == "loaded"],
            refused=[rid for rid, r in reports.items() if r.state == "refused"],
            retry=[by_id[rid] for rid, r in reports.items() if r.state == "failed"],
            dropped=[rid for rid in by_id if rid not in reports],
            error=error,
            details={rid: r.detail for rid, r in reports.items() if r.state != "loaded"},
        )

    def _drop_group(self, kind: str | None = None) -> None:
        """Leave the held group of ``kind`` (all held groups when None)."""
        for k in [kind] if kind is not None else list(self.held):
            held = self.held.pop(k, None)
            if held is not None:
                held.group.close()

    # ---- late joiners --------------------------------------------------------------------------------
    async def catch_up(self) -> None:
        """Replicas that ask for the version held (``wants_version``: they joined late, or were dropped) get it
        in a round of their own, from what the outbox holds (at most ``max_attempts`` tries each); when it
        holds the version no more, they are left waiting for the next."""
        manifest, lock = self.outbox.manifest, self.publisher.lock
        if manifest is None or lock.locked():
            return
        v = manifest.version
        behind = [i for i in await self.registry.alive()
                  if self.serves(i) and i.weight_version < v
                  and i.wants_version == v and self._catch_up_tries[(i.replica_id, v)] < self.settings.max_attempts]
        if manifest.adapter is not None:  # an adapter version is no use to a replica that cannot load adapters
            for i in [i for i in behind if not i.adapters]:
                self._catch_up_tries[(i.replica_id, v)] = self.settings.max_attempts
                self.waiting.add(i.replica_id)  # the next publish (soon: replicas_waiting) goes out merged
            behind = [i for i in behind if i.adapters]
        if not behind:
            return
        async with lock:
            if self.outbox.manifest is not manifest:
                return
            if not await asyncio.to_thread(self.outbox.intact):
                log.info("version %d is no longer held (weights sent in place have changed since, or its buckets "
                         "were packed into reused buffers: retain none): %s get the next version",
                         v, [i.replica_id for i in behind])
                for i in behind:
                    self._catch_up_tries[(i.replica_id, v)] = self.settings.max_attempts
                    self.waiting.add(i.replica_id)
                return
            for i in behind:
                self._catch_up_tries[(i.replica_id, v)] += 1
            report = PublishReport(version=v, total_bytes=manifest.total_bytes)
            await self.deliver(behind, Shipment(report=report, clock=PhaseClock(), main=False))
        log.info("caught up %s to version %d (dropped=%s refused=%s)", report.loaded, v, report.dropped,
                 report.refused)

    def close(self) -> None:
        self._drop_group()
