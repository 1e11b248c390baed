"""The replica's tensor side (hf engine): read tensors out of received flat buckets and load a version into
a module's own parameters and buffers, by copy or by re-pointing them at the received buffers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from shared.weight_sync.tensors import dtype_name, torch_dtype
from shared.weight_sync.wire import Bucket, TensorEntry


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


@torch.no_grad()
def read_bucket(targets: dict[str, torch.Tensor], bucket: Bucket, out: torch.Tensor) -> None:
    """Bucket ``bucket`` as the module holds it now, written into ``out`` (a flat uint8 buffer on any device):
    each tensor's bytes in the wire dtype at its offset, what the learner's packing produced for that version."""
    for e in bucket.tensors:
        if not e.nbytes:
            continue
        src = targets[e.name].detach()
        dt = torch_dtype(e.dtype)
        if src.dtype != dt:
            src = src.to(dt)
        out[e.offset:e.offset + e.nbytes].copy_(src.contiguous().reshape(-1).view(torch.uint8))


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

    def forget_views(self) -> None:
        """Some of the model's tensors were re-pointed elsewhere (an adapter's merge swaps storage): the copy
        plan's views of the old storage must not be used again."""
        self._plan = None

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
        _, _, dst_views, src_views, slow = plan
        if dst_views:
            torch._foreach_copy_(list(dst_views), list(src_views))
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
