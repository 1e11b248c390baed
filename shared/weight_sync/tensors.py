"""Torch side of the protocol: collect named tensors, pack buckets into flat byte buffers, checksum them,
and copy received bytes into a model in place. Imports torch (callers import this module lazily)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any

import torch

from shared.weight_sync.digest import digest
from shared.weight_sync.walk import ModuleWalk
from shared.weight_sync.wire import Bucket, TensorEntry

_DTYPE_NAMES: dict[torch.dtype, str] = {}
_DTYPE, _SHAPE = attrgetter("dtype"), attrgetter("shape")


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def module_tensors(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A module's parameters and persistent buffers under their ``state_dict`` names, without building a
    state dict (no per-tensor detach, no hooks: a few ms instead of tens for a model of thousands of tensors)."""
    return ModuleWalk().tensors(module)


def named_tensors(weights: Any, walk: Any = None) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs from an ``nn.Module`` (its parameters and persistent buffers, as in its state
    dict; ``walk``, a :class:`~shared.weight_sync.walk.ModuleWalk`, remembers the module's layout between
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
    dnames = list(map(_DTYPE_NAMES.get, dtypes))
    if None in dnames:  # a dtype not seen before (strings only: no tensor comparisons)
        dnames = list(map(dtype_name, dtypes))
    return list(zip(names, dnames, map(_SHAPE, tensors)))


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


def checksum(buf: torch.Tensor, algo: str = "xxh3_64") -> int:
    """Digest of a uint8 buffer's bytes (see :mod:`shared.weight_sync.digest`; releases the GIL)."""
    return digest(buf, algo)


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
    view.set_(storage, start, (bucket.nbytes,))
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


def staging_buffers(sizes: Sequence[int], device: Any = "cpu", pin: bool = False) -> list[torch.Tensor]:
    """Flat uint8 buffers of these sizes, their pages touched now (a fresh page costs more to fault in
    during a transfer than the copy itself; kept buffers pay it once). ``pin``: page-locked host memory
    where CUDA is present, so copies between it and a GPU run at full speed and asynchronously."""
    pin = pin and str(device) == "cpu" and torch.cuda.is_available()
    out = []
    for n in sizes:
        buf = torch.empty(n, dtype=torch.uint8, device=device, pin_memory=pin)
        buf.zero_()
        out.append(buf)
    return out


def view_tensor(buf: torch.Tensor, e: TensorEntry) -> torch.Tensor:
    """The tensor ``e`` as stored in ``buf`` (a copy only when its offset is not aligned for its dtype)."""
    raw = buf[e.offset:e.offset + e.nbytes]
    dt = torch_dtype(e.dtype)
    if e.offset % dt.itemsize:
        raw = raw.clone()
    return raw.view(dt).reshape(e.shape)


def unpack(bucket: Bucket, buf: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    for e in bucket.tensors:
        yield e.name, view_tensor(buf, e)


class InPlaceLoader:
    """Copies received tensors into a module's own parameters and buffers (no reload, no second model).

    Names follow ``state_dict``; every name of a tied weight maps to the same storage. A tensor whose
    dtype differs from the parameter's is converted on copy; a shape mismatch or an unknown name is an
    error raised before anything is written (``check``)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.targets: dict[str, torch.Tensor] = dict(module.state_dict(keep_vars=True))
        self._plan: tuple[Any, list, tuple, tuple, list] | None = None  # (layout, buffers, dst, src, slow)
        self._adopt_plans: list[tuple[Any, list, list, list]] = []       # (layout, buffers, pairs, slow), <= 2
        self._checked: tuple[Bucket, ...] | None = None                  # the last layout check_buckets passed
        # names whose storage another tensor object shares (tied weights that are not one Parameter): only
        # a copy updates every alias, so these are never re-pointed by ``adopt``
        by_storage: dict[int, set[int]] = {}
        for t in self.targets.values():
            if t.numel():
                by_storage.setdefault(t.untyped_storage().data_ptr(), set()).add(id(t))
        self._aliased = {n for n, t in self.targets.items()
                         if t.numel() and len(by_storage[t.untyped_storage().data_ptr()]) > 1}

    def check_buckets(self, buckets: Sequence[Bucket]) -> None:
        """:meth:`check` every tensor of a layout, remembering the last layout that passed (replicas get
        the same bucket objects for the same layout, see RoundWatcher.manifest)."""
        if self._checked is not None and len(self._checked) == len(buckets) and \
                all(a is b for a, b in zip(self._checked, buckets)):
            return
        self.check(e for b in buckets for e in b.tensors)
        self._checked = tuple(buckets)

    def check(self, entries: Iterable[TensorEntry]) -> None:
        for e in entries:
            tgt = self.targets.get(e.name)
            if tgt is None:
                raise KeyError(f"the model has no tensor named {e.name!r}")
            if tuple(tgt.shape) != e.shape:
                raise ValueError(f"{e.name}: the model has shape {tuple(tgt.shape)}, the update {e.shape}")

    @torch.no_grad()
    def copy_bytes(self, e: TensorEntry, buf: torch.Tensor) -> None:
        tgt = self.targets[e.name].data
        if dtype_name(tgt.dtype) == e.dtype and tgt.is_contiguous() and tgt.device == buf.device:
            tgt.reshape(-1).view(torch.uint8).copy_(buf[e.offset:e.offset + e.nbytes])
        else:
            tgt.copy_(view_tensor(buf, e).to(tgt.device))

    @torch.no_grad()
    def apply(self, buckets: Sequence[Bucket], buffers: Sequence[torch.Tensor]) -> None:
        """Copy every tensor of a received version into the model: one batched copy for the tensors whose
        dtype, device and layout match (views computed once per layout and buffer set), per tensor for the rest."""
        layout = [b.tensors for b in buckets]
        plan = self._plan
        if plan is None or plan[0] != layout or len(plan[1]) != len(buffers) or \
                any(a is not b for a, b in zip(plan[1], buffers)):
            dst, src, slow = [], [], []
            for b, buf in zip(buckets, buffers):
                for e in b.tensors:
                    tgt = self.targets[e.name].data
                    if dtype_name(tgt.dtype) == e.dtype and tgt.is_contiguous() and tgt.device == buf.device:
                        if e.nbytes:
                            dst.append(tgt.reshape(-1).view(torch.uint8))
                            src.append(buf[e.offset:e.offset + e.nbytes])
                    else:
                        slow.append((e, buf))
            plan = self._plan = (layout, list(buffers), tuple(dst), tuple(src), slow)
        _, _, dst, src, slow = plan
        if dst:
            torch._foreach_copy_(list(dst), list(src))
        for e, buf in slow:
            self.copy_bytes(e, buf)

    @torch.no_grad()
    def adopt(self, buckets: Sequence[Bucket], buffers: Sequence[torch.Tensor]) -> bool:
        """Point the model's tensors at their bytes in ``buffers`` (no copy; the buffers become the model's
        storage, so the caller must not receive into them again while they are live). Tensors that cannot
        be re-pointed (other dtype or device, misaligned, aliased) are copied. True if any was re-pointed.

        The views are computed once per layout and buffer set (two sets alternate), so this costs about a
        microsecond per tensor."""
        layout = [b.tensors for b in buckets]
        plan = next((p for p in self._adopt_plans if p[0] == layout and len(p[1]) == len(buffers)
                     and all(x is y for x, y in zip(p[1], buffers))), None)
        if plan is None:
            pairs, slow = [], []
            for b, buf in zip(buckets, buffers):
                for e in b.tensors:
                    tgt = self.targets[e.name]
                    dt = torch_dtype(e.dtype)
                    if e.name not in self._aliased and tgt.dtype == dt and tgt.device == buf.device and \
                            e.offset % dt.itemsize == 0 and e.nbytes:
                        pairs.append((tgt, buf[e.offset:e.offset + e.nbytes].view(dt).view(e.shape)))
                    else:
                        slow.append((e, buf))
            plan = (layout, list(buffers), pairs, slow)
            self._adopt_plans = [*self._adopt_plans[-1:], plan]
        _, _, pairs, slow = plan
        for tgt, view in pairs:
            tgt.data = view
        for e, buf in slow:
            self.copy_bytes(e, buf)
        self._plan = None  # copy views point at the old storage now
        return bool(pairs)

    @torch.no_grad()
    def copy_tensor(self, name: str, src: torch.Tensor) -> None:
        self.targets[name].data.copy_(src.to(self.targets[name].device))
