"""Torch side of the protocol: collect named tensors, pack buckets into flat byte buffers, checksum them,
and copy received bytes into a model in place. Imports torch (callers import this module lazily)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from shared.weight_sync.wire import Bucket, TensorEntry


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def named_tensors(weights: Any) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs from an ``nn.Module`` (its state dict; tied weights sent once, under the
    first name), a mapping, or an iterable of pairs."""
    if isinstance(weights, torch.nn.Module):
        seen: set[tuple[int, int, torch.dtype, tuple[int, ...]]] = set()
        out = []
        for name, t in weights.state_dict(keep_vars=False).items():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape))
            if t.numel() and key in seen:
                continue
            seen.add(key)
            out.append((name, t))
        return out
    items = weights.items() if isinstance(weights, Mapping) else weights
    out = [(str(n), t) for n, t in items]
    for n, t in out:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"weights[{n!r}] is a {type(t).__name__}, not a torch.Tensor")
    return out


def specs(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    for name, t in named:
        yield name, dtype_name(t.dtype), tuple(t.shape)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a tensor's data (a contiguous copy first if it is not contiguous)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def pack_bucket(bucket: Bucket, lookup: Mapping[str, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy the bucket's tensors into one flat uint8 CPU buffer (``out`` if given)."""
    buf = out if out is not None else torch.empty(bucket.nbytes, dtype=torch.uint8)
    for e in bucket.tensors:
        src = lookup[e.name]
        if tuple(src.shape) != e.shape or dtype_name(src.dtype) != e.dtype:
            raise ValueError(f"tensor {e.name!r} changed since the manifest was planned")
        if e.nbytes:
            buf[e.offset:e.offset + e.nbytes].copy_(as_bytes(src), non_blocking=False)
    return buf


def checksum(buf: torch.Tensor) -> int:
    """CRC32 of a uint8 buffer's bytes (zlib releases the GIL, so it overlaps with transfers)."""
    host = buf if buf.device.type == "cpu" else buf.cpu()
    return zlib.crc32(memoryview(host.numpy()))


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
    def copy_tensor(self, name: str, src: torch.Tensor) -> None:
        self.targets[name].data.copy_(src.to(self.targets[name].device))
