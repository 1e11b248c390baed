"""Publishing a sharded (FSDP) model: its tensors gathered bucket by bucket while the publisher packs them.

No rank holds a whole parameter between steps (each holds 1/N of it as a ``DTensor``), so the publisher cannot
read the weights; gathering the whole model on rank 0 first would cost a full copy of it there. Instead,
for one publish every rank holds a :class:`ShardedWeights` of the same model:

- rank 0's publisher plans its buckets from :meth:`ShardedWeights.named` (full names, dtypes and shapes), and
  packs each bucket with :meth:`ShardedWeights.pack`: it tells the other ranks which tensors the bucket holds
  (a broadcast of their positions), then all ranks gather them one tensor at a time (``full_tensor``, an
  all-gather) and rank 0 copies each into the bucket as it arrives. The extra memory on rank 0 is the bucket
  being filled plus one gathered tensor; the bytes are those of the unsharded model, so are the digests;
- the other ranks :meth:`ShardedWeights.serve`: they join each gather rank 0 announces until it says the publish
  is over (:meth:`ShardedWeights.finish`, which the publisher calls whatever happened).

Every announcement and gather is a collective on the default group, under its timeout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from services.learner.weights.packing import as_bytes, module_tensors
from shared.weight_sync.tensors import dtype_name
from shared.weight_sync.wire import Bucket

_DONE = -1


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # here, not at import: 1.2 s of every learner's start-up

    return t.to_local() if isinstance(t, DTensor) else t


class ShardedWeights:
    """One publish of a sharded module (see the module docstring). Collective: build one on every rank."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.rank = dist.get_rank()
        items = module_tensors(module)
        # tied tensors (the same parameter under two names) are sent once, under the first name
        seen: set[int] = set()
        self._named: list[tuple[str, torch.Tensor]] = []
        for name, t in items:
            loc = _local(t)
            key = id(t) if loc.numel() == 0 else loc.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            self._named.append((name, t))
        self._index = {name: i for i, (name, _) in enumerate(self._named)}
        self.device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")
        self.open = True
        self.gathered_bytes = 0  # bytes rank 0 gathered (for tests and logs)
        self.peak_gather_bytes = 0  # the largest single gathered tensor

    def named(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` with each tensor's full dtype and shape (a DTensor's are the whole parameter's)."""
        return list(self._named)

    # ---- rank 0 --------------------------------------------------------------------------------------
    def pack(self, bucket: Bucket, out: torch.Tensor) -> torch.Tensor:
        """Gather the bucket's tensors from every rank into ``out`` (rank 0; the others :meth:`serve`)."""
        if not self.open:
            raise RuntimeError("this publish's gathers are over: take new ShardedWeights for the next publish")
        if out.numel() != bucket.nbytes:
            raise ValueError(f"bucket {bucket.index} holds {bucket.nbytes} bytes, the buffer {out.numel()}")
        positions = [self._index[e.name] for e in bucket.tensors]
        self._announce(positions)
        for e, i in zip(bucket.tensors, positions):
            full = self._gather(i)
            if tuple(full.shape) != e.shape or dtype_name(full.dtype) != e.dtype:
                raise ValueError(f"tensor {e.name!r} changed since the manifest was planned")
            if e.nbytes:
                out[e.offset:e.offset + e.nbytes].copy_(as_bytes(full))
            del full
        return out

    def finish(self) -> None:
        """Tell the other ranks this publish's gathers are over (rank 0; once; the publisher calls it)."""
        if self.open and self.rank == 0:
            self.open = False
            self._announce([])

    def _announce(self, positions: Sequence[int]) -> None:
        header = torch.tensor([len(positions) if positions else _DONE], dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        if positions:
            dist.broadcast(torch.tensor(list(positions), dtype=torch.int64, device=self.device), src=0)

    def _gather(self, i: int) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        t = self._named[i][1]
        full = t.full_tensor() if isinstance(t, DTensor) else t
        nbytes = full.numel() * full.element_size()
        self.gathered_bytes += nbytes
        self.peak_gather_bytes = max(self.peak_gather_bytes, nbytes)
        return full.detach()

    # ---- the other ranks -----------------------------------------------------------------------------
    def serve(self) -> int:
        """Join every gather rank 0 announces until it finishes the publish; returns the buckets served."""
        buckets = 0
        while True:
            header = torch.zeros(1, dtype=torch.int64, device=self.device)
            dist.broadcast(header, src=0)
            n = int(header[0])
            if n == _DONE:
                self.open = False
                return buckets
            if n < 0 or n > len(self._named):
                raise RuntimeError(f"rank {self.rank}: rank 0 announced a gather of {n} tensors; this model has "
                                   f"{len(self._named)}: the ranks hold different models")
            positions = torch.empty(n, dtype=torch.int64, device=self.device)
            dist.broadcast(positions, src=0)
            for i in positions.tolist():
                if not 0 <= i < len(self._named):
                    raise RuntimeError(f"rank {self.rank}: rank 0 announced tensor {i} of {len(self._named)}")
                self._gather(i)
            buckets += 1
