"""Replica side of the protocol (the rollout service's weight sidecar), engine-agnostic: find the rounds a replica is in, read manifests, report
results, and (for engines whose sidecar receives the bytes itself) receive and verify a version's buckets.

    watcher = RoundWatcher(redis, run, replica_id)
    rdv, member = await watcher.next_round()           # a round that names this replica
    manifest = await watcher.manifest(rdv)
    got = BucketReceiver().receive(rdv, member, manifest)   # blocking: run it in a thread
    got.verify(await watcher.checksums(rdv, manifest))      # UpdateRefused if a bucket is corrupt
    ... load got.buffers ...
    await watcher.report(rdv, "loaded")                # or "failed" (alive, round broke) / "refused" (bad data)

Each bucket is digested as soon as it has arrived, while the next one is still on the wire; the
publisher's digests (:class:`~shared.weight_sync.wire.Checksums`) are compared at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from shared.weight_sync import keys as wkeys
from shared.weight_sync import net
from shared.weight_sync.digest import digest
from shared.weight_sync.group import CollectiveError, open_group
from shared.weight_sync.tensors import staging_buffers
from shared.weight_sync.wire import (
    Checksums,
    IpcRound,
    Manifest,
    Member,
    MemberReport,
    Rendezvous,
    ReportState,
)

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")

log = logging.getLogger(__name__)


class DeltaRebuild(Protocol):
    """What a sink that applies delta rounds gives :meth:`BucketReceiver.receive_delta`: bucket ``i``'s bytes as
    the replica holds them now, and a patch applied to them (:class:`UpdateRefused` when it does not fit)."""

    def current(self, i: int, out: Any) -> None: ...
    def patch(self, i: int, buf: Any, patch: Any) -> None: ...


class RoundFailed(RuntimeError):
    """The round broke (a peer died, a timeout): the replica is alive and can take part in a retry."""


class RoundAbandoned(RoundFailed):
    """The publisher gave up on the round while this replica was still in it (forming the group, or in a
    collective): the replica reports at once and leaves whatever still runs to end on its own."""


class UpdateRefused(RuntimeError):
    """The data is wrong (checksum, names, shapes): the replica keeps its current version."""


class RoundWatcher:
    """Finds the rounds that name this replica. ``key`` / ``record``: where the round is written and its type
    (collective rounds: the rendezvous; ``ipc`` rounds: :class:`~shared.weight_sync.wire.IpcRound`)."""

    def __init__(self, redis: Any, run: str, replica_id: str, poll_s: float = 0.05, key: str | None = None,
                 record: type[Rendezvous | IpcRound] = Rendezvous) -> None:
        self.redis, self.run, self.replica_id, self.poll_s = redis, run, replica_id, poll_s
        self.key = key or wkeys.rendezvous(run)
        self.record = record
        self.last_round = 0
        self._seen: str | None = None  # last announcement id read (see wait)
        self._layout: tuple[Any, Manifest] | None = None  # (raw buckets, parsed manifest) of the last layout

    async def current(self) -> tuple[Rendezvous, Member] | None:
        """The newest round naming this replica that it has not handled yet, if any."""
        raw = await self.redis.get(self.key)
        if raw is None:
            return None
        rdv = self.record.loads(raw)
        if rdv.round <= self.last_round:
            return None
        member = rdv.member(self.replica_id)
        if member is None:
            return None
        self.last_round = rdv.round
        return rdv, member

    async def wait(self, timeout_s: float) -> tuple[Rendezvous, Member] | None:
        """:meth:`current`, or else block up to ``timeout_s`` until the publisher announces a round and check
        again: a replica joins a round as soon as it is announced, without polling the key."""
        key = wkeys.announcements(self.run)
        if self._seen is None:  # read from the newest announcement on, so none after this point is missed
            newest = await self.redis.xrevrange(key, count=1)
            self._seen = newest[0][0] if newest else "0-0"
        found = await self.current()
        if found is not None:
            return found
        resp = await self.redis.xread({key: self._seen}, count=64, block=max(1, int(timeout_s * 1000)))
        for _stream, entries in resp or []:
            if entries:
                self._seen = entries[-1][0]
        return await self.current()

    async def next_round(self) -> tuple[Rendezvous, Member]:
        while True:
            found = await self.wait(self.poll_s)
            if found is not None:
                return found

    async def manifest(self, rdv: Rendezvous) -> Manifest:
        """The round's manifest. When the round names the layout this replica already holds (the usual case:
        same model, next version), it is rebuilt from the rendezvous without a fetch, so the replica joins
        the broadcast at once (the stored manifest differs only in fields a collective round does not use:
        its snapshot and creation time). A LoRA learner's merged round (``rdv.merged_adapter``) is fetched: its
        manifest names the merged adapter."""
        cached = self._layout
        if rdv.layout_id and cached is not None and cached[1].layout_id == rdv.layout_id and not rdv.merged_adapter:
            return cached[1].model_copy(update={"version": rdv.version, "checksum": rdv.checksum, "snapshot": None,
                                                "merged_adapter": None})
        # a publisher whose members all hold the layout writes the manifest while the first bucket is on its
        # way: a member that does need it (none should) waits for it, bounded
        deadline = time.monotonic() + min(rdv.init_timeout_s, 10.0)
        while (raw := await self.redis.get(rdv.manifest_key)) is None:
            if time.monotonic() >= deadline:
                raise RoundFailed(f"manifest {rdv.manifest_key} is gone")
            await asyncio.sleep(0.005)
        return self._parse(raw)

    def _parse(self, raw: bytes | str) -> Manifest:
        """Parse a manifest, reusing the validated buckets of the previous one when the layout is the same
        (the usual case; validating thousands of tensor entries again costs milliseconds per update)."""
        data = json.loads(raw)
        cached = self._layout
        if cached is not None and data.get("buckets") == cached[0]:
            head = Manifest.model_validate({**data, "buckets": ()})
            manifest = head.model_copy(update={"buckets": cached[1].buckets})
            self._layout = (cached[0], manifest)
            return manifest
        manifest = Manifest.model_validate(data)
        self._layout = (data.get("buckets"), manifest)
        return manifest

    async def checksums(self, rdv: Rendezvous, manifest: Manifest) -> Checksums | None:
        """The publisher's digests of ``manifest``'s buckets (None if it has none). The publisher writes them
        before it broadcasts the last bucket, so after a complete receive they are there; a short wait
        covers readers that come early."""
        if not manifest.checksum:
            return None
        key = wkeys.checksums(self.run, manifest.version)
        deadline = time.monotonic() + rdv.collective_timeout_s
        while (raw := await self.redis.get(key)) is None:
            if time.monotonic() >= deadline:
                raise RoundFailed(f"checksums of version {manifest.version} never arrived")
            await asyncio.sleep(0.005)
        rec = Checksums.loads(raw)
        if rec.version != manifest.version or len(rec.values) != len(manifest.buckets):
            raise UpdateRefused(f"checksums record does not match version {manifest.version}'s manifest")
        return rec

    async def latest_manifest(self, version: int) -> Manifest | None:
        raw = await self.redis.get(wkeys.manifest(self.run, version))
        return None if raw is None else Manifest.loads(raw)

    async def copied(self, rdv: Any) -> None:
        """Tell the publisher of an ipc round that this replica has its own copy of the buckets (it may change
        them again); the version is verified and switched to afterwards, without holding the learner."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.rpush(wkeys.copied(self.run, rdv.round), self.replica_id)
        pipe.expire(wkeys.copied(self.run, rdv.round), 3600)
        pipe.rpush(wkeys.reported(self.run, rdv.round), self.replica_id)  # wakes the publisher
        pipe.expire(wkeys.reported(self.run, rdv.round), 3600)
        await pipe.execute()

    async def report(self, rdv: Rendezvous, state: ReportState, detail: str = "") -> None:
        r = MemberReport(replica_id=self.replica_id, round=rdv.round, version=rdv.version, state=state,
                         detail=detail[:2000])
        key, wake = wkeys.reports(self.run, rdv.round), wkeys.reported(self.run, rdv.round)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, self.replica_id, r.dumps())
        pipe.expire(key, 24 * 3600)
        pipe.rpush(wake, self.replica_id)  # wakes the publisher (see WeightPublisher._settle)
        pipe.expire(wake, 3600)
        await pipe.execute()


class AbandonWatch:
    """While a member takes part in a round: looks every ``poll_s`` at whether the publisher gave up on it
    (``wkeys.abandoned``, set as soon as the round broke). Then ``flag`` (a ``threading.Event``) is set, which the
    receiving thread's waits look at (:meth:`BucketReceiver.receive`), and :meth:`outlast` stops waiting for that
    thread: a member may be where no flag reaches it (forming the group: gloo connects every pair of ranks in one
    blocking call, and a peer killed or hung mid-connect holds it there for gloo's own connect timeout, however long
    the publisher waits). A survivor of a broken round so reports within a fraction of a second of the publisher
    giving up, whatever its collective timeout, and however its peers died.

        async with AbandonWatch(redis, run, rdv.round) as watch:
            got = await watch.outlast(asyncio.to_thread(receiver.receive, rdv, member, manifest, watch.flag))
    """

    def __init__(self, redis: Any, run: str, round_id: int, poll_s: float = 0.1) -> None:
        self.redis, self.key, self.poll_s = redis, wkeys.abandoned(run, round_id), poll_s
        self.round_id = round_id
        self.flag = threading.Event()
        self._abandoned = asyncio.Event()
        self._done = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.ensure_future(self._watch())
        return self

    async def outlast(self, work: Awaitable[T]) -> T:
        """``work``'s result, or :class:`RoundAbandoned` as soon as the publisher gives up on the round; ``work`` then
        goes on in the background (a thread cannot be stopped; it sees ``flag`` and ends its part itself), and what it
        raises then is dropped."""
        task = asyncio.ensure_future(work)
        abandoned = asyncio.ensure_future(self._abandoned.wait())
        try:
            await asyncio.wait({task, abandoned}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            abandoned.cancel()
        if task.done():
            return task.result()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no "never retrieved" warning
        raise RoundAbandoned(f"round {self.round_id} was abandoned by its publisher (left while still forming the "
                             "group or in a collective)")

    async def __aexit__(self, *exc: object) -> None:
        self._done.set()
        if self._task is not None:
            # it ends after the read in flight (a cancelled read costs redis-py its connection): bounded, then cancelled
            _, late = await asyncio.wait({self._task}, timeout=2.0)
            for t in late:
                t.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        while not self._done.is_set():
            try:
                if await self.redis.exists(self.key):
                    self.flag.set()
                    self._abandoned.set()
                    return
            except Exception as exc:  # noqa: BLE001 - Redis away: the round's collective timeout still bounds it
                log.debug("reading %s failed: %s", self.key, exc)
            try:
                await asyncio.wait_for(self._done.wait(), self.poll_s)
            except (asyncio.TimeoutError, TimeoutError):
                pass


@dataclass
class Received:
    """A version's buckets as received, with the digest this replica computed of each."""

    manifest: Manifest
    buffers: list[Any]
    digests: list[int | None]

    def verify(self, sums: Checksums | None, required: bool = False) -> None:
        """Raise :class:`UpdateRefused` unless every bucket matches the publisher's digest (or, unless
        ``required``, the version carries none)."""
        if sums is None:
            if required:
                raise UpdateRefused(f"version {self.manifest.version} carries no checksums (weights.require_checksums)")
            return
        bad = [i for i, (mine, theirs) in enumerate(zip(self.digests, sums.values)) if mine != theirs]
        if bad:
            raise UpdateRefused(f"version {self.manifest.version}: bucket(s) {bad} failed the checksum")


class StagingSets:
    """The receive side's flat staging buffers (one flat copy of the weights): a spare set kept between updates
    (``keep_staging``) so that a receive faults in no fresh pages; :meth:`take` hands it out when its sizes fit,
    :meth:`recycle` takes a set back once nothing reads it."""

    def __init__(self, device: Any = "cpu", keep_staging: bool = True) -> None:
        self.device = device
        self.keep_staging = keep_staging
        self._spare: list[Any] | None = None

    def recycle(self, buffers: list[Any]) -> None:
        """``buffers`` are free again (applied by copy, refused, or no longer the model's storage)."""
        if self.keep_staging:
            self._spare = buffers

    def ensure_spare(self, sizes: list[int]) -> None:
        """Allocate (and touch) a spare set of these sizes now, off the update path."""
        if self.keep_staging and (self._spare is None or [b.numel() for b in self._spare] != sizes):
            self._spare = staging_buffers(sizes, self.device)

    def take(self, sizes: list[int]) -> list[Any]:
        """A set of these sizes: the spare one when it fits, else a new one."""
        spare, self._spare = self._spare, None
        return spare if spare is not None and [b.numel() for b in spare] == sizes else staging_buffers(sizes, self.device)


class BucketReceiver(StagingSets):
    """Receives a version's buckets into staging buffers over the round's group, digesting each bucket
    as it lands (while the next is still on the wire).

    Holds the group between rounds so that the publisher can reuse it; a round with a new group name
    closes the old group and forms the new one. A receive takes the spare staging set (one flat copy of
    the weights, pages touched when allocated) when its sizes fit, else allocates one; the caller hands a
    set back with :meth:`recycle` once nothing reads it. Without ``keep_staging`` nothing is kept (less
    memory; each update then faults in fresh pages, which costs more than the transfer's copies)."""

    def __init__(self, device: Any = "cpu", keep_staging: bool = True, bind_addr: str | None = None) -> None:
        super().__init__(device, keep_staging)
        self.group: Any = None
        self.bind_addr = bind_addr  # where this replica's gloo sockets listen (None: see gloo_addr)

    def gloo_addr(self, rdv: Rendezvous) -> str | None:
        """The address this replica's gloo sockets listen on and advertise: ``bind_addr``, else this host's
        address on the route to the publisher (127.0.0.1 when the publisher is on this host)."""
        return self.bind_addr or net.route_addr(rdv.master_addr)

    def receive(self, rdv: Rendezvous, member: Member, manifest: Manifest,
                abandoned: threading.Event | None = None) -> Received:
        """Join (or reuse) the group, receive every bucket and digest it. Blocking.

        Raises :class:`RoundFailed` if the group or a broadcast fails, or as soon as ``abandoned`` is set (the
        publisher gave up on the round: :class:`AbandonWatch`) while a broadcast is awaited."""
        group = self._join(rdv, member, abandoned)
        try:
            buffers = self.take([b.nbytes for b in manifest.buckets])
            works = [group.broadcast(buf, src=0) for buf in buffers]
            digests: list[int | None] = []
            for buf, work in zip(buffers, works):
                group.wait(work, cancel=abandoned)
                digests.append(digest(buf, manifest.checksum) if manifest.checksum else None)
        except CollectiveError as exc:
            self.close()
            raise RoundFailed(str(exc)) from exc
        return Received(manifest, buffers, digests)

    def receive_delta(self, rdv: Rendezvous, member: Member, manifest: Manifest, rebuild: DeltaRebuild | None,
                      abandoned: threading.Event | None = None) -> Received:
        """A delta round's broadcasts, piece by piece as the publisher builds them (buckets cut every
        ``rdv.delta.piece_bytes``): first the piece's size (one int64: -1 whole, 0 unchanged, n a patch of n
        bytes), then the piece or its patch. While the size of a bucket's first piece is on its way,
        ``rebuild.current`` writes the bytes this replica holds into the staging buffer; a patch is applied to
        its piece of them (``rebuild.patch``) as soon as it lands, while the publisher builds the next one; every
        bucket is digested after its last piece. With ``rebuild`` None (the replica cannot take this round) every broadcast is
        still received (the group needs every rank) and nothing is rebuilt: the caller refuses.

        Blocking; raises as :meth:`receive`. A patch that does not fit stops the rebuilding (the rest is still
        received) and is raised as :class:`UpdateRefused` at the end."""
        import torch

        from shared.weight_sync.delta import PatchError, pieces

        assert rdv.delta is not None
        try:
            cut = pieces([b.nbytes for b in manifest.buckets], rdv.delta.piece_bytes)
        except PatchError as exc:
            raise RoundFailed(str(exc)) from exc
        group = self._join(rdv, member, abandoned)
        buffers = self.take([b.nbytes for b in manifest.buckets])
        digests: list[int | None] = []
        refused: UpdateRefused | None = None
        try:
            for i, lo, hi in cut:  # pieces of the buckets: a patch each, or the piece whole, or nothing
                bucket = manifest.buckets[i]
                head = torch.empty(1, dtype=torch.int64, device=self.device)
                work = group.broadcast(head, src=0)
                if rebuild is not None and refused is None and lo == 0:
                    rebuild.current(i, buffers[i])  # the bytes held now, while the publisher sends the size
                group.wait(work, cancel=abandoned)
                size = int(head.item())
                if size < -1 or size >= max(hi - lo, 1):  # out of step with the publisher: leave the group
                    self.close()
                    raise RoundFailed(f"delta round: bucket {i} bytes {lo}-{hi} announced as {size} bytes")
                if size:
                    into = buffers[i][lo:hi] if size < 0 else torch.empty(size, dtype=torch.uint8, device=self.device)
                    group.wait(group.broadcast(into, src=0), cancel=abandoned)
                    if size > 0 and rebuild is not None and refused is None:
                        try:
                            rebuild.patch(i, buffers[i][lo:hi], into)
                        except UpdateRefused as exc:
                            refused = exc
                if hi == bucket.nbytes and rebuild is not None and refused is None and manifest.checksum:
                    digests.append(digest(buffers[i], manifest.checksum))  # the bucket's last piece
        except CollectiveError as exc:
            self.recycle(buffers)
            self.close()
            raise RoundFailed(str(exc)) from exc
        except BaseException:
            self.recycle(buffers)
            raise
        if rebuild is None or refused is not None:
            self.recycle(buffers)
            if refused is not None:
                raise refused
            return Received(manifest, [], [])
        return Received(manifest, buffers, digests if manifest.checksum else [None] * len(buffers))

    def _join(self, rdv: Rendezvous, member: Member, abandoned: threading.Event | None) -> Any:
        """The round's group: the one held when the round reuses it, else formed now."""
        if self.group is not None and (rdv.fresh_group or self.group.name != rdv.group_name or self.group.broken):
            self.close()  # a fresh group may carry a name seen before (its port was used by an earlier group)
        if self.group is None:
            if not rdv.fresh_group:
                raise RoundFailed(f"round {rdv.round} reuses group {rdv.group_name}, which this replica does not hold")
            try:
                self.group = open_group(
                    rdv.group, backend=rdv.backend, master_addr=rdv.master_addr, master_port=rdv.master_port,
                    rank=member.rank, world_size=rdv.world_size, group_name=rdv.group_name,
                    init_timeout_s=rdv.init_timeout_s, collective_timeout_s=rdv.collective_timeout_s,
                    gloo_addr=self.gloo_addr(rdv))
            except CollectiveError as exc:
                raise RoundFailed(str(exc)) from exc
        group = self.group
        if abandoned is not None and abandoned.is_set():  # formed after the publisher gave up (the caller has left)
            self.close()
            raise RoundAbandoned(f"round {rdv.round} was abandoned while this replica formed its group")
        return group

    def close(self) -> None:
        self._spare = None
        if self.group is not None:
            self.group.close()
            self.group = None
