"""What a publisher sends for the version it holds: each bucket's bytes, packed on first use, their digests,
and what is kept for replicas that join late.

Where a bucket's bytes come from, in order of preference:

- **in place**: the weights were laid out flat (:meth:`WeightPublisher.flatten`), so the bucket is a view
  of their own memory and nothing is copied. Nothing is retained either: a late joiner is served from
  it only while the weights still hold the version (digests compared);
- **pooled** (``retain: none``, the default with nccl): packed into one of ``inflight_buckets + 1``
  buffers on the device the weights live on (GPU weights are packed on the GPU: no trip through host
  memory, no host copy of the model), reused bucket after bucket. Nothing is retained: a late joiner
  gets the next version;
- **copied** (``retain: copy``, the default with gloo): packed into a host buffer per bucket, kept until
  the next version, so a late joiner can be served it at any time (the cost: one flat copy of the weights
  in host memory; pinned with nccl, whose buckets are copied to the GPU from it).

A GPU bucket that goes where only host memory can be read (gloo, a snapshot file, a host digest) is copied
down first (:func:`~shared.weight_sync.placement.wire_staging`): into a pinned host buffer per bucket, kept and
reused while the layout stays the same (:meth:`Outbox.host_copy`).

Buffers are reused while the layout stays the same (the usual case: same model, next step), so steady-state
publishes fault in no fresh pages.
"""

from __future__ import annotations

from typing import Any

from services.learner.weights import packing
from shared.weight_sync.digest import digest
from shared.weight_sync.placement import wire_staging
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.tensors import staging_buffers
from shared.weight_sync.wire import Bucket, Checksums, Manifest


class Outbox:
    """The buckets of one version on their way out (see the module docstring). Not thread-safe: one user."""

    def __init__(self, settings: WeightSyncSettings) -> None:
        self.settings = settings
        self.manifest: Manifest | None = None
        self.lookup: dict[str, Any] | None = None  # the tensors being published, while packing
        self.source: Any = None  # a ShardedWeights that gathers each bucket from every rank (weights/shards.py)
        self.send_in_place = False  # set by WeightPublisher.flatten(): use the weights' memory where it can be
        self.buffers: list[Any] = []    # retained host copy of bucket i (copy mode; None until first packed)
        self.wire: list[Any] = []       # what goes out for bucket i
        self.in_place: list[bool] = []  # wire[i] is the weights' own memory
        self.pooled: list[bool] = []    # wire[i] sits in a pool buffer (until another bucket takes it)
        self.packed: list[bool] = []    # wire[i] holds bucket i of the current version
        self.sums: list[int | None] = []
        self._views: dict[int, tuple] = {}  # bucket index -> (bucket, tensor positions, its view or None)
        self._pool: list[Any] = []           # pool buffers (pooled mode), by slot
        self._owner: list[int | None] = []   # the bucket each pool slot holds
        self._uploads: list[Any] = []        # per slot: CUDA event after its host -> GPU copy (pinned host slots)
        self._host: list[Any] = []           # per bucket: pinned host copy of a GPU bucket (gloo, files, host digests)
        self._host_ok: list[bool] = []       # _host[i] holds bucket i of the current version
        self._dev: list[Any] = []            # per bucket: GPU copy held for IPC sharing (weights not sent in place)
        self._dev_ok: list[bool] = []        # _dev[i] holds bucket i of the current version

    @property
    def pooling(self) -> bool:
        """Pack into reused pool buffers instead of retained copies? (A snapshot needs every bucket at once.)"""
        s = self.settings
        return s.snapshot_dir is None and (s.retain == "none" or (s.retain == "auto" and s.backend == "nccl"))

    def begin(self, manifest: Manifest, lookup: dict[str, Any], source: Any = None) -> None:
        """Make ``manifest`` the version held; its buckets get packed on the way out (gathered by ``source``,
        a :class:`~services.learner.weights.shards.ShardedWeights`, where the weights are sharded)."""
        old = self.manifest
        # same layout? pack into the same buffers: no allocation, no page faults (they cost more than the copy)
        same = old is not None and len(self.buffers) == len(manifest.buckets) and \
            all(a.nbytes == b.nbytes for a, b in zip(old.buckets, manifest.buckets))
        n = len(manifest.buckets)
        if not same:
            self.buffers = [None] * n
            self._host = [None] * n
            self._dev = [None] * n
        self.manifest, self.lookup, self.source = manifest, lookup, source
        self.packed, self.sums = [False] * n, [None] * n
        self.wire, self.in_place, self.pooled = [None] * n, [False] * n, [False] * n
        self._host_ok = [False] * n
        self._dev_ok = [False] * n
        self._owner = [None] * len(self._pool)

    def forget(self) -> None:
        """Nothing is held any more (a publish failed half-way)."""
        self.manifest = None

    def release(self) -> None:
        """The publish is over: drop the references to the published tensors (pooled buckets go with them)."""
        self.lookup = self.source = None

    # ---- bytes ---------------------------------------------------------------------------------------
    def pack(self, i: int) -> Any:
        """Bucket ``i``'s bytes (packed now unless they are already there)."""
        if not self.packed[i]:
            if self.lookup is None or self.manifest is None:
                raise RuntimeError(f"bucket {i} is no longer held: the publish that packed it is over")
            b = self.manifest.buckets[i]
            buf = self._view(i, b) if self.send_in_place else None
            self.in_place[i], self.pooled[i] = buf is not None, False
            if buf is None and self.pooling:
                buf = self._pool_slot(i, b)
                self._pack_into(b, buf)
                self.pooled[i] = True
            elif buf is None:
                buf = self.buffers[i]
                if buf is None:
                    buf = self.buffers[i] = staging_buffers([b.nbytes], pin=self.settings.backend == "nccl")[0]
                self._pack_into(b, buf)
            self.wire[i] = buf
            self.packed[i] = True
            self._host_ok[i] = self._dev_ok[i] = False
        return self.wire[i]

    def _pack_into(self, bucket: Bucket, buf: Any) -> None:
        if self.source is not None:
            self.source.pack(bucket, buf)
        else:
            assert self.lookup is not None  # pack() checked it
            packing.pack_bucket(bucket, self.lookup, out=buf)

    def host_copy(self, i: int) -> Any:
        """Bucket ``i``'s bytes in host memory: the packed buffer itself when it is there, else a pinned host
        copy of the GPU bucket (made once per version, into a buffer kept while the layout stays the same)."""
        buf = self.pack(i)
        staging = wire_staging("file", str(buf.device))
        if not staging.copy:
            return buf
        if not self._host_ok[i]:
            host = self._host[i]
            if host is None or host.numel() != buf.numel():
                host = self._host[i] = staging_buffers([buf.numel()], pin=staging.pinned)[0]
            host.copy_(buf)  # GPU -> pinned host: returns once the bytes are there
            self._host_ok[i] = True
        return self._host[i]

    def device_copy(self, i: int) -> Any:
        """Bucket ``i``'s bytes on the GPU, held there until the next version (the ``ipc`` transport shares it
        by handle): the weights' own memory when sent in place, else a GPU copy kept per bucket (on the device
        the weights live on, or the current one for host weights)."""
        import torch

        buf = self.pack(i)
        if buf.device.type == "cuda" and self.in_place[i]:
            return buf
        if not self._dev_ok[i]:
            device = buf.device if buf.device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
            dev = self._dev[i]
            if dev is None or dev.numel() != buf.numel() or dev.device != device:
                dev = self._dev[i] = staging_buffers([buf.numel()], device)[0]
            dev.copy_(buf)
            self._dev_ok[i] = True
        return self._dev[i]

    def _pool_slot(self, i: int, bucket: Bucket) -> Any:
        """A pool buffer for bucket ``i``, sized to it, on the device its tensors live on (pinned host memory
        for host tensors going to a GPU). Slot ``i % (inflight_buckets + 1)``: the bucket that held it before
        has left the wire (the send loop waits for it before packing this one)."""
        import torch

        slots = self.settings.inflight_buckets + 1
        if len(self._pool) != slots:
            self._pool, self._owner, self._uploads = [None] * slots, [None] * slots, [None] * slots
        slot = i % slots
        upload, self._uploads[slot] = self._uploads[slot], None
        if upload is not None:  # a host slot: its last copy to the GPU may still be reading it
            upload.synchronize()
        prev = self._owner[slot]
        if prev is not None and prev != i:
            self.packed[prev] = self.pooled[prev] = False
            self.wire[prev] = None
        assert self.lookup is not None and self.manifest is not None  # pack() checked both
        first = self.lookup[bucket.tensors[0].name] if bucket.tensors else None
        on_gpu = self.settings.backend == "nccl" and first is not None and first.device.type == "cuda"
        device = first.device if on_gpu and first is not None else torch.device("cpu")
        need = max(b.nbytes for b in self.manifest.buckets)
        buf = self._pool[slot]
        if buf is None or buf.numel() < need or buf.device != device:
            pin = device.type == "cpu" and self.settings.backend == "nccl"
            buf = self._pool[slot] = staging_buffers([need], device, pin=pin)[0]
        self._owner[slot] = i
        return buf[:bucket.nbytes]

    def pool_pinned(self) -> bool:
        """Are the pool's host buffers page-locked (for tests and logs)?"""
        return all(b is None or b.device.type != "cpu" or b.is_pinned() for b in self._pool)

    def _view(self, i: int, bucket: Bucket) -> Any:
        """``bucket_view`` of bucket ``i``; its full check (layout, storage, dtypes of every tensor) is skipped
        when each tensor is where that check last found it (the usual case: training steps in place)."""
        assert self.lookup is not None
        tensors = [self.lookup[e.name] for e in bucket.tensors]
        where = [(t.data_ptr(), t.is_contiguous()) for t in tensors]
        known = self._views.get(i)
        if known is not None and known[0] is bucket and known[1] == where:
            return known[2]
        view = packing.bucket_view(bucket, self.lookup)
        self._views[i] = (bucket, where, view)
        return view

    def wire_buffer(self, i: int) -> Any:
        """Bucket ``i`` as broadcast: packed if needed, on the GPU for nccl, in host memory for gloo
        (:func:`~shared.weight_sync.placement.wire_staging`)."""
        buf = self.pack(i)
        staging = wire_staging(self.settings.backend, str(buf.device))
        if staging.copy and staging.device == "cpu":
            return self.host_copy(i)
        if staging.copy:
            import torch

            out = buf.to(torch.device("cuda", torch.cuda.current_device()), non_blocking=True)
            if self.pooled[i]:  # the slot is packed again later: that must wait for this (asynchronous) copy
                event = torch.cuda.Event()
                event.record()
                self._uploads[self._owner.index(i)] = event
            return out
        return buf

    # ---- digests -------------------------------------------------------------------------------------
    def digest(self, i: int) -> None:
        """Digest bucket ``i`` if the version has checksums and it has not been digested yet."""
        m = self.manifest
        if m is not None and m.checksum and self.sums[i] is None:
            self.sums[i] = digest(self._digest_source(i), m.checksum)

    def _digest_source(self, i: int) -> Any:
        """Where bucket ``i`` is digested: where it lives for wsum64 (computed on the GPU), else in host memory
        (the host algorithms read bytes through numpy: a GPU bucket's staged host copy, made once)."""
        buf = self.pack(i)
        if buf.device.type == "cuda" and self.manifest is not None and self.manifest.checksum != "wsum64":
            return self.host_copy(i)
        return buf

    def checksums(self) -> Checksums | None:
        """The version's :class:`Checksums` record, once every bucket is digested (None without checksums)."""
        m = self.manifest
        if m is None or not m.checksum or any(x is None for x in self.sums):
            return None
        return Checksums(version=m.version, algo=m.checksum, values=tuple(int(x) for x in self.sums if x is not None))  # (none is: checked above)

    def finish(self) -> None:
        """After the version's rounds: pack and digest what late joiners could be served (copies are kept;
        in-place buckets are digested so that their staying intact can be checked). Pooled buckets keep
        nothing, so nothing is done for them."""
        if self.manifest is None or (self.pooling and not self.send_in_place):
            return
        for i, bucket in enumerate(self.manifest.buckets):
            if self.pooling and self._view(i, bucket) is None:
                continue  # it would be pooled: nothing to keep
            self.pack(i)
            self.digest(i)

    def intact(self) -> bool:
        """Can a late joiner be served the version held? Copies: always. In place: only while the weights
        have not changed since (digests compared). Pooled: never (nothing was kept)."""
        m = self.manifest
        if m is None:
            return False
        if any(self.pooled) or not all(self.packed):
            return False
        live = [i for i, flag in enumerate(self.in_place) if flag]
        if not live:
            return True
        if not m.checksum:
            return False
        return all(digest(self.wire[i], m.checksum) == self.sums[i] for i in live)
