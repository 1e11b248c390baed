"""The publisher's tensor side: list a model's named tensors, pack them into flat bucket buffers as the
manifest lays them out, find buckets already laid out in place, and lay weights out that way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any, cast

import torch

from services.learner.weights.walk import ModuleWalk
from shared.weight_sync.tensors import DTYPE_NAMES, dtype_name, torch_dtype
from shared.weight_sync.wire import Bucket

_DTYPE, _SHAPE = attrgetter("dtype"), attrgetter("shape")


def module_tensors(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A module's parameters and persistent buffers under their ``state_dict`` names, without building a
    state dict (no per-tensor detach, no hooks: a few ms instead of tens for a model of thousands of tensors)."""
    return ModuleWalk().tensors(module)


def named_tensors(weights: Any, walk: Any = None) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs from an ``nn.Module`` (its parameters and persistent buffers, as in its state
    dict; ``walk``, a :class:`~services.learner.weights.walk.ModuleWalk`, remembers the module's layout between
    calls), a mapping, or an iterable of pairs. Tensors that share memory (tied weights) are sent once, under
    the first name: receivers tie them the same way (every loader maps each name onto the model's own tensor)."""
    if isinstance(weights, torch.nn.Module):
        items = (walk or ModuleWalk()).tensors(weights)  # parameters and buffers: tensors by construction
    else:
        items = [(str(n), t) for n, t in (weights.items() if isinstance(weights, Mapping) else weights)]
        for name, t in items:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"weights[{name!r}] is a {type(t).__name__}, not a torch.Tensor")
    ptrs = [t.data_ptr() for _, t in items]
    if len(set(ptrs)) == len(ptrs):  # no two tensors start at the same address: nothing is tied
        return list(items)
    seen: set[tuple[int, torch.dtype, torch.Size]] = set()
    out = []
    for (name, t), ptr in zip(items, ptrs):
        key = (ptr, t.dtype, t.shape)
        if key in seen and t.numel():
            continue
        seen.add(key)
        out.append((name, t))
    return out


def specs(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, str, torch.Size]]:
    """``(name, dtype name, shape)`` of each tensor (what a bucket plan depends on)."""
    named = list(named)
    names, tensors = zip(*named) if named else ((), ())
    dtypes = list(map(_DTYPE, tensors))
    dnames = list(map(DTYPE_NAMES.get, dtypes))
    if None in dnames:  # a dtype not seen before (strings only: no tensor comparisons)
        dnames = list(map(dtype_name, dtypes))
    return list(zip(names, cast("list[str]", dnames), map(_SHAPE, tensors)))  # no None left (checked above)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a tensor's data (a contiguous copy first if it is not contiguous)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def pack_bucket(bucket: Bucket, lookup: Mapping[str, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy the bucket's tensors into one flat uint8 buffer (``out`` if given, on any device; else a new CPU
    buffer). Tensors on ``out``'s device are concatenated in one call (one kernel launch per ~hundred
    tensors on a GPU instead of one per tensor); any other goes through a copy of its own."""
    buf = out if out is not None else torch.empty(bucket.nbytes, dtype=torch.uint8)
    if buf.numel() != bucket.nbytes:
        raise ValueError(f"bucket {bucket.index} holds {bucket.nbytes} bytes, the buffer {buf.numel()}")
    parts = []
    for e in bucket.tensors:
        src = lookup[e.name]
        if tuple(src.shape) != e.shape or dtype_name(src.dtype) != e.dtype:
            raise ValueError(f"tensor {e.name!r} changed since the manifest was planned")
        parts.append(as_bytes(src))
    if all(p.device == buf.device for p in parts):
        torch.cat(parts, out=buf)
        return buf
    for e, part in zip(bucket.tensors, parts):
        if e.nbytes:
            buf[e.offset:e.offset + e.nbytes].copy_(part, non_blocking=False)
    return buf



def bucket_view(bucket: Bucket, lookup: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The bucket as a flat uint8 view of memory its tensors already occupy, back to back in manifest order
    (after :func:`flatten_into_buckets`, or a framework's own flat parameter buffer); None if they do not."""
    if not bucket.tensors or not bucket.nbytes:
        return None
    first = lookup[bucket.tensors[0].name]
    storage = first.untyped_storage()
    base = first.data_ptr() - bucket.tensors[0].offset
    start = base - storage.data_ptr()
    if start < 0 or start + bucket.nbytes > storage.nbytes():
        return None
    sptr = storage.data_ptr()
    for e in bucket.tensors:
        t = lookup[e.name]
        if t.data_ptr() != base + e.offset or not t.is_contiguous() or t.untyped_storage().data_ptr() != sptr \
                or tuple(t.shape) != e.shape or dtype_name(t.dtype) != e.dtype:
            return None
    view = torch.empty(0, dtype=torch.uint8, device=first.device)
    view.set_(storage, start, (bucket.nbytes,), (1,))  # the stride given: torch's stub has no overload without it
    return view


@torch.no_grad()
def flatten_into_buckets(named: Sequence[tuple[str, torch.Tensor]], buckets: Sequence[Bucket]) -> list[torch.Tensor]:
    """Move tensors into one flat buffer per bucket, laid out as the manifest says, and point each tensor
    at its place (``t.data = view``: the same Parameter objects, so optimizers and modules keep working).
    Afterwards :func:`bucket_view` finds every bucket in place and publishing copies nothing. A tensor whose
    offset is not aligned for its dtype keeps its own memory (its bucket is then packed as usual)."""
    lookup = dict(named)
    out = []
    for b in buckets:
        device = lookup[b.tensors[0].name].device if b.tensors else "cpu"
        flat = torch.empty(b.nbytes, dtype=torch.uint8, device=device)
        for e in b.tensors:
            t = lookup[e.name]
            dt = torch_dtype(e.dtype)
            if not e.nbytes or e.offset % dt.itemsize or t.device != flat.device:
                continue
            view = flat[e.offset:e.offset + e.nbytes].view(dt).view(e.shape)
            view.copy_(t)
            t.data = view
        out.append(flat)
    return out
