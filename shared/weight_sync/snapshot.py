"""Fallback transport: one safetensors file per bucket per version, on a shared path or over HTTP.

A bucket's bytes are already laid out as a safetensors data section (tensors back to back), so a file is
the JSON header followed by the bucket buffer as is. Files are read back with the ``safetensors``
library (no pickle) after their CRC32 is checked.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from shared.weight_sync.wire import Bucket, SnapshotInfo

_ST_DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}


class SnapshotError(RuntimeError):
    """A snapshot file is missing, unreadable or does not match its checksum."""


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"v{version:010d}"


def _header(bucket: Bucket) -> bytes:
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    for e in bucket.tensors:
        meta[e.name] = {"dtype": _ST_DTYPES[e.dtype], "shape": list(e.shape),
                        "data_offsets": [e.offset, e.offset + e.nbytes]}
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_snapshot(root: str | Path, version: int, buckets: Sequence[Bucket], buffers: Sequence[Any],
                   url: str | None = None, keep: int = 2) -> SnapshotInfo:
    """Write ``version`` (CPU uint8 bucket buffers) atomically under ``root``; prune old versions."""
    final = version_dir(root, version)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files, sums = [], []
    for b, buf in zip(buckets, buffers):
        name = f"bucket-{b.index:05d}.safetensors"
        head = _header(b)
        data = memoryview(buf.numpy())
        with open(tmp / name, "wb") as f:
            f.write(head)
            f.write(data)
        files.append(name)
        sums.append(zlib.crc32(data, zlib.crc32(head)))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _prune(Path(root), keep)
    return SnapshotInfo(path=str(final), url=f"{url.rstrip('/')}/{final.name}" if url else None,
                        files=tuple(files), checksums=tuple(sums))


def _prune(root: Path, keep: int) -> None:
    versions = sorted(p for p in root.glob("v*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in versions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def fetch_file(info: SnapshotInfo, i: int, timeout_s: float, prefer_url: bool = False) -> bytes:
    """Bytes of file ``i``: from the shared path when it is visible here, else over HTTP."""
    local = Path(info.path) / info.files[i]
    if not prefer_url and local.is_file():
        data = local.read_bytes()
    elif info.url:
        import httpx

        try:
            r = httpx.get(f"{info.url}/{info.files[i]}", timeout=timeout_s)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            raise SnapshotError(f"fetching {info.files[i]} from {info.url} failed: {exc}") from exc
        data = r.content
    else:
        raise SnapshotError(f"{local} is not visible here and the snapshot has no URL")
    if zlib.crc32(data) != info.checksums[i]:
        raise SnapshotError(f"{info.files[i]}: checksum mismatch (file corrupt or replaced)")
    return data


def read_snapshot(info: SnapshotInfo, timeout_s: float = 120.0, prefer_url: bool = False) -> Iterator[dict[str, Any]]:
    """Each file's tensors (a dict name -> CPU tensor), verified, one file at a time."""
    from safetensors.torch import load

    for i in range(len(info.files)):
        yield load(fetch_file(info, i, timeout_s, prefer_url))
