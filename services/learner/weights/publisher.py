"""Learner side: publish a version of the weights to every rollout replica.

    pub = WeightPublisher(redis, run, WeightSyncSettings(...))     # redis: a redis.asyncio client
    version = await pub.publish(model)        # nn.Module, {name: tensor} or [(name, tensor)]
    pub.last_report                           # PublishReport: loaded / dropped / refused replicas
    await pub.close()                         # or: async with WeightPublisher(...) as pub

What ``publish`` does, in order (every wait bounded by a setting):

1. plans the buckets and builds the manifest (with the safetensors snapshot when ``snapshot_dir`` is
   set: then every bucket is packed first);
2. runs update rounds with the live collective replicas: writes the manifest (JSON; in the same round
   trip, just before the first round's rendezvous) and a :class:`Rendezvous`, forms (or reuses) the
   group as rank 0, and broadcasts each bucket once, taking its bytes from the :class:`Outbox` (the
   weights' own memory after :meth:`WeightPublisher.flatten`; else packed into a retained host copy or a
   reused device buffer, see ``retain``) while the previous buckets are still on the wire (a pipeline: at
   most ``inflight_buckets`` broadcasts outstanding), and digesting it once its broadcast is under way.
   After the last digest the :class:`Checksums` record is written; then each member's report is collected.
   A round that breaks (a member died or hung) is abandoned: survivors report ``failed`` and the next
   round re-runs the version with them in a fresh group; members that never report are dropped;
3. packs what late joiners can be served and no round sent (see :meth:`Outbox.finish`);
4. sets ``shared.keys.weights_version(run)`` to the version and returns it.

A background task (started on first publish) brings replicas that join later (or were dropped) to the
latest version from what the outbox holds, in a group of their own (or, if it holds nothing any more, at
the next version). Keep the event loop responsive (run training steps in a thread) so that it can run;
otherwise they catch up at the next publish.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from services.learner.weights import packing as T
from services.learner.weights.outbox import Outbox
from services.learner.weights.walk import ModuleWalk
from shared import keys
from shared.weight_sync import keys as wkeys
from shared.weight_sync import net
from shared.weight_sync.group import open_group
from shared.weight_sync.phases import PhaseClock
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import (
    Manifest,
    Member,
    MemberReport,
    Rendezvous,
    ReplicaInfo,
    layout_id,
    plan_buckets,
)

log = logging.getLogger(__name__)


@dataclass
class PublishReport:
    """What happened to one version (or one catch-up)."""

    version: int
    loaded: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    rounds: int = 0
    total_bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent per step (see PhaseClock)


@dataclass
class _Outcome:
    loaded: list[str]
    refused: list[str]
    retry: list[ReplicaInfo]
    dropped: list[str]
    error: str = ""


@dataclass
class _HeldGroup:
    group: Any
    rendezvous: Rendezvous


def group_name_for(master_port: int) -> str:
    """A group's name follows from its rendezvous port, so an engine whose init call carries no group name
    (vLLM's ``init_info``) can still name it. No two groups held at once share a port; a later group may
    reuse one (a fixed ``rendezvous_port``), so members go by ``Rendezvous.fresh_group``, not by the name."""
    return f"fleetrl-weights-{master_port}"


class WeightPublisher:
    """Publishes versioned weights; see the module docstring. Not safe to share across event loops."""

    def __init__(self, redis: Any, run: str, settings: WeightSyncSettings | None = None) -> None:
        self.redis, self.run = redis, run
        self.settings = settings or WeightSyncSettings()
        self.registry = ReplicaRegistry(redis, run)
        self.last_report: PublishReport | None = None
        self._last_version = 0  # the newest version this publisher published
        self.outbox = Outbox(self.settings)  # the held version's buckets: packed, digested, kept for late joiners
        self._sums_written = False
        self._plan_key: list | None = None
        self._plan: tuple | None = None
        self._layout_id = ""
        self._walk = ModuleWalk()  # a published module's tensors, re-walked only when its structure changes
        self._held: dict[str, _HeldGroup] = {}  # group kind -> the group kept for the next version
        self._lock = asyncio.Lock()
        self._catch_up_task: asyncio.Task | None = None
        self._catch_up_tries: Counter[tuple[str, int]] = Counter()
        self._waiting: set[str] = set()  # replicas that asked for a version no longer held (see replicas_waiting)
        self._closing = asyncio.Event()
        self._clock = PhaseClock()
        self._manifest_unwritten = False  # the retained manifest is not in Redis yet (see _round)
        self._next_round: int | None = None  # a round id taken in advance for the publish's first round

    async def __aenter__(self) -> WeightPublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- public API ----------------------------------------------------------------------------------
    async def publish(self, weights: Any, *, version: int | None = None) -> int:
        """Publish ``weights`` as a new version (default: latest + 1) and return the version."""
        t0 = time.perf_counter()
        s = self.settings
        async with self._lock:
            clock = self._clock = PhaseClock()
            pipe = self.redis.pipeline(transaction=False)  # one round trip: latest version, registry, round id
            pipe.get(keys.weights_version(self.run))
            pipe.hgetall(wkeys.replicas(self.run))
            pipe.incr(wkeys.round_counter(self.run))
            latest, listing, self._next_round = await pipe.execute()
            # a Redis that restarted may have lost the last version it was told (appendfsync everysec); this
            # publisher's own record keeps a version number from being handed out twice
            latest = max(int(latest or 0), self._last_version)
            v = latest + 1 if version is None else int(version)
            if v <= latest:
                raise ValueError(f"version {v} is not newer than the latest published version {latest}")
            named = T.named_tensors(weights, self._walk)
            if not named:
                raise ValueError("nothing to publish: no tensors")
            buckets = self._plan_for(T.specs(named))
            manifest = Manifest(version=v, bucket_bytes=s.bucket_bytes, total_bytes=sum(b.nbytes for b in buckets),
                                buckets=buckets, checksum=s.digest_algo if s.checksum else None,
                                layout_id=self._layout_id)
            self.outbox.begin(manifest, dict(named))
            self._sums_written = False
            self._waiting.clear()  # this version goes to every live replica
            clock.lap("plan")
            try:
                if s.snapshot_dir:
                    from services.learner.weights.snapshot import write_snapshot

                    await asyncio.to_thread(self.outbox.finish)  # (every bucket: a snapshot implies copies)
                    snapshot = await asyncio.to_thread(write_snapshot, s.snapshot_dir, v, buckets, self.outbox.wire,
                                                       s.snapshot_url, s.snapshot_keep)
                    manifest = manifest.model_copy(update={"snapshot": snapshot})
                    self.outbox.manifest = manifest
                self._manifest_unwritten = True  # written by the first round (see _round)
                targets = [i for i in await self.registry.alive(listing) if self._collective(i)]
                clock.lap("manifest")
                report = await self._sync(targets, main=True)
                if self._manifest_unwritten:  # no round ran
                    await self.redis.set(wkeys.manifest(self.run, v), manifest.dumps(), ex=s.key_ttl_s)
                    self._manifest_unwritten = False
                await asyncio.to_thread(self.outbox.finish)
                await self._write_checksums()
            except BaseException:
                self.outbox.forget()  # half-packed: nothing to serve late joiners from
                raise
            finally:
                self.outbox.release()
            await self.redis.set(keys.weights_version(self.run), str(v))
            self._last_version = v
            clock.lap("finish")
            report.seconds = time.perf_counter() - t0
            report.phases = {k: round(x, 6) for k, x in clock.phases.items()}
            self.last_report = report
        self._ensure_catch_up()
        log.info("published version %d (%.1f MB, %d buckets) in %.2fs (%s): loaded=%s dropped=%s refused=%s",
                 v, manifest.total_bytes / 1e6, len(buckets), report.seconds,
                 " ".join(f"{k} {x * 1e3:.0f}ms" for k, x in report.phases.items()), report.loaded, report.dropped,
                 report.refused)
        return v

    @property
    def replicas_waiting(self) -> list[str]:
        """Replicas that joined (or fell behind) after the last publish and could not be served it from what
        the outbox holds (weights sent in place have moved on, or ``retain: none``): they serve older weights
        until the next publish, so a learner that publishes only every few steps should publish sooner."""
        return sorted(self._waiting)

    async def close(self) -> None:
        """Stop the catch-up task and leave the held group."""
        if self._catch_up_task is not None:
            # the loop ends at its next sleep (cancelling it inside a redis call can stall the client)
            self._closing.set()
            _, late = await asyncio.wait([self._catch_up_task], timeout=self.settings.catch_up_poll_s + 5.0)
            for t in late:
                t.cancel()
            await asyncio.gather(self._catch_up_task, return_exceptions=True)
            self._catch_up_task = None
            self._closing = asyncio.Event()
        self._drop_group()

    def flatten(self, model: Any) -> int:
        """Lay ``model``'s tensors out in place the way :meth:`publish` buckets them: one flat buffer per
        bucket, each parameter pointed at its slice (same Parameter objects; optimizers keep working).
        Publishing ``model`` (or its ``state_dict()``) then sends straight from the weights' memory, with no
        pack copy. Returns the bucket count.

        Call it once, before training (plain torch training; not under frameworks that manage parameter
        memory themselves, e.g. DeepSpeed). Trade-off: the publisher retains no copy of the version it
        sent, so a replica that joins late is brought up from memory only while the weights still hold
        that version (checked by digest); once training has moved on, it gets the next version."""
        named = T.named_tensors(model, self._walk)
        buckets = self._plan_for(T.specs(named))
        T.flatten_into_buckets(named, buckets)
        self.outbox.send_in_place = True
        return len(buckets)

    # ---- packing -------------------------------------------------------------------------------------
    def _plan_for(self, specs: list) -> tuple:
        """The bucket plan of these tensor specs (reused while they stay the same)."""
        if specs != self._plan_key:
            self._plan_key, self._plan = specs, tuple(plan_buckets(specs, self.settings.bucket_bytes))
            self._layout_id = layout_id(self._plan, self.settings.bucket_bytes)
        return self._plan

    async def _write_checksums(self) -> None:
        rec = self.outbox.checksums()
        if rec is None or self._sums_written:
            return
        await self.redis.set(wkeys.checksums(self.run, rec.version), rec.dumps(), ex=self.settings.key_ttl_s)
        self._sums_written = True

    # ---- rounds --------------------------------------------------------------------------------------
    def _collective(self, info: ReplicaInfo) -> bool:
        return info.transport == "collective" and info.backend == self.settings.backend

    async def _sync(self, targets: list[ReplicaInfo], *, main: bool) -> PublishReport:
        """Bring ``targets`` to the retained version: one series of rounds per group kind (replicas of
        different kinds cannot share a group; e.g. vLLM servers join a PyNccl group), one kind after the other."""
        assert self.outbox.manifest is not None
        report = PublishReport(version=self.outbox.manifest.version, total_bytes=self.outbox.manifest.total_bytes)
        by_kind: dict[str, list[ReplicaInfo]] = {}
        for t in targets:
            by_kind.setdefault(t.group, []).append(t)
        for kind, remaining in by_kind.items():
            for _ in range(self.settings.max_attempts):
                if not remaining:
                    break
                out = await self._round(remaining, main=main, kind=kind)
                report.rounds += 1
                report.loaded += out.loaded
                report.refused += out.refused
                report.dropped += out.dropped
                if out.error:
                    report.errors.append(out.error)
                remaining = out.retry
            report.dropped += [i.replica_id for i in remaining]
        if main:  # kinds with no member left: their held groups are of no use any more
            for kind in [k for k in self._held if k not in by_kind]:
                self._drop_group(kind)
        return report

    async def _round(self, members: list[ReplicaInfo], *, main: bool, kind: str) -> _Outcome:
        s, manifest = self.settings, self.outbox.manifest
        round_id, self._next_round = self._next_round, None
        if round_id is None:
            round_id = await self.redis.incr(wkeys.round_counter(self.run))
        round_id = int(round_id)
        ids = [m.replica_id for m in members]
        held = self._held.get(kind) if main else None
        reuse = held is not None and not held.group.broken and [m.replica_id for m in held.rendezvous.members] == ids
        if main and not reuse:
            self._drop_group(kind)
        listener = None  # the new group's rendezvous socket, bound before the rendezvous names its port
        if reuse:
            base = held.rendezvous
            rdv = base.model_copy(update={"round": round_id, "version": manifest.version, "fresh_group": False,
                                          "manifest_key": wkeys.manifest(self.run, manifest.version),
                                          "layout_id": manifest.layout_id, "checksum": manifest.checksum,
                                          "created_at": time.time()})
        else:
            placed, rank = [], 1
            for m in members:
                placed.append(Member(replica_id=m.replica_id, rank=rank, ranks=m.ranks))
                rank += m.ranks
            listener = net.listen(s.listen_addr, s.rendezvous_port, s.rendezvous_ports)
            port = listener.getsockname()[1]
            rdv = Rendezvous(
                round=round_id, version=manifest.version, manifest_key=wkeys.manifest(self.run, manifest.version),
                group_name=group_name_for(port), fresh_group=True, backend=s.backend, group=kind,
                master_addr=s.master_addr, master_port=port, world_size=rank,
                members=tuple(placed), init_timeout_s=s.init_timeout_s,
                collective_timeout_s=s.collective_timeout_s, load_timeout_s=s.load_timeout_s,
                layout_id=manifest.layout_id, checksum=manifest.checksum,
            )
        # the manifest (~100 bytes a tensor) goes before the rendezvous that names it, unless every member
        # already holds its layout (same group, same layout as its last round): members then rebuild it from
        # the rendezvous, and it is written while the first bucket is on its way
        late_manifest, write_late = None, False
        pipe = self.redis.pipeline(transaction=False)
        if self._manifest_unwritten:
            self._manifest_unwritten = False
            write_late = reuse and held.rendezvous.layout_id == manifest.layout_id
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
        self._clock.lap("announce")
        group = held.group if reuse else None
        try:
            if group is None:
                group = await asyncio.to_thread(
                    open_group, kind, backend=rdv.backend, master_addr=rdv.master_addr,
                    master_port=rdv.master_port, rank=0, world_size=rdv.world_size, group_name=rdv.group_name,
                    init_timeout_s=rdv.init_timeout_s, collective_timeout_s=rdv.collective_timeout_s,
                    listener=listener, gloo_addr=s.gloo_addr)
                self._clock.lap("group")
            await self._send(group)
            if late_manifest is not None:
                await late_manifest
            self._clock.lap("send")
        except Exception as exc:
            self._clock.lap("send")  # (up to the failure)
            if listener is not None:
                listener.close()  # unless the store took it over (then this is a no-op)
            if late_manifest is not None:
                await asyncio.gather(late_manifest, return_exceptions=True)
            log.warning("round %d (version %d, members %s) broke: %s", round_id, manifest.version, ids, exc)
            if group is not None:
                group.broken = True
                group.close()
            if main:
                self._held.pop(kind, None)
            # survivors may sit in a broadcast until their own collective timeout fires, then report
            broke = await self._settle(round_id, members, s.collective_timeout_s + s.regroup_timeout_s,
                                       error=str(exc))
            self._clock.lap("settle")
            return broke
        if main:
            self._held[kind] = _HeldGroup(group, rdv)
        else:
            group.close()
        out = await self._settle(round_id, members, s.load_timeout_s)
        self._clock.lap("settle")
        if main and (out.dropped or out.retry):
            self._drop_group(kind)  # membership changed: the next round forms a new group
        return out

    async def _send(self, group: Any) -> None:
        """Broadcast every bucket from rank 0, packing bucket k+1 while bucket k is on the wire (at most
        ``inflight_buckets`` outstanding). Each bucket is digested while its broadcast is under way (digests
        never hold bytes back), and the checksums record is written as soon as the last digest is done:
        usually before the replicas, which digest what they received, come to read it (they wait for it,
        bounded by the collective timeout)."""
        n = len(self.outbox.manifest.buckets)
        pending: deque[Any] = deque()
        for i in range(n):
            wire = await asyncio.to_thread(self.outbox.wire_buffer, i)
            pending.append(group.broadcast(wire, src=0))
            await asyncio.to_thread(self.outbox.digest, i)
            if i == n - 1:
                await self._write_checksums()
            while len(pending) > self.settings.inflight_buckets:
                await asyncio.to_thread(group.wait, pending.popleft())
        while pending:
            await asyncio.to_thread(group.wait, pending.popleft())

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
        )

    def _drop_group(self, kind: str | None = None) -> None:
        """Leave the held group of ``kind`` (all held groups when None)."""
        for k in [kind] if kind is not None else list(self._held):
            held = self._held.pop(k, None)
            if held is not None:
                held.group.close()

    # ---- late joiners --------------------------------------------------------------------------------
    def _ensure_catch_up(self) -> None:
        if self._catch_up_task is None or self._catch_up_task.done():
            self._catch_up_task = asyncio.get_running_loop().create_task(self._catch_up_loop())

    async def _catch_up_loop(self) -> None:
        failing_since: float | None = None  # a failing pass (Redis down) is logged once, then every 30 s
        last_logged = 0.0
        while True:
            try:
                await asyncio.wait_for(self._closing.wait(), self.settings.catch_up_poll_s)
                return
            except (asyncio.TimeoutError, TimeoutError):
                pass
            try:
                await self._catch_up_once()
                if failing_since is not None:
                    log.info("catch-up passes work again (failed for %.1fs)", time.monotonic() - failing_since)
                    failing_since = None
            except Exception as exc:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                if now - last_logged >= 30.0 or failing_since == now:
                    last_logged = now
                    log.warning("catch-up pass failed (failing for %.1fs): %s", now - failing_since, exc)

    async def _catch_up_once(self) -> None:
        manifest = self.outbox.manifest
        if manifest is None or self._lock.locked():
            return
        v = manifest.version
        behind = [i for i in await self.registry.alive()
                  if self._collective(i) and i.weight_version < v and i.wants_version == v
                  and self._catch_up_tries[(i.replica_id, v)] < self.settings.max_attempts]
        if not behind:
            return
        async with self._lock:
            if self.outbox.manifest is not manifest:
                return
            if not await asyncio.to_thread(self.outbox.intact):
                log.info("version %d is no longer held (weights sent in place have changed since, or its buckets "
                         "were packed into reused buffers: retain none): %s get the next version",
                         v, [i.replica_id for i in behind])
                for i in behind:
                    self._catch_up_tries[(i.replica_id, v)] = self.settings.max_attempts
                    self._waiting.add(i.replica_id)
                return
            for i in behind:
                self._catch_up_tries[(i.replica_id, v)] += 1
            self._clock = PhaseClock()
            report = await self._sync(behind, main=False)
        log.info("caught up %s to version %d (dropped=%s refused=%s)", report.loaded, v, report.dropped,
                 report.refused)
