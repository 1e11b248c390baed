"""The snapshot transport, publisher side: it writes the files; replicas pull them (nothing is sent).

The files: one safetensors file per bucket per version, on a shared path
(optionally served over HTTP by a server you run), named in the manifest's
:class:`~shared.weight_sync.wire.SnapshotInfo` with each file's CRC32.

A bucket's bytes are already laid out as a safetensors data section (tensors back to back), so a file is
the JSON header followed by the bucket buffer as is. Replicas read them back with the ``safetensors``
library (no pickle) after checking the CRC32 (``services/rollout/weights/snapshot.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.learner.weights.transport import Shipment, WeightTransport
from shared.weight_sync.wire import Bucket, Manifest, ReplicaInfo, SnapshotInfo

_ST_DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}


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
    """Write ``version`` (host uint8 bucket buffers: stage GPU buckets first, ``Outbox.host_copy``) atomically under
    ``root``; prune old versions."""
    final = version_dir(root, version)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files, sums = [], []
    for b, buf in zip(buckets, buffers):
        name = f"bucket-{b.index:05d}.safetensors"
        head = _header(b)
        if buf.device.type != "cpu":
            raise ValueError(f"bucket {b.index} is on {buf.device}: stage it to host memory before writing it")
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


class SnapshotTransport(WeightTransport):
    """For replicas that cannot join a collective (``transport: snapshot``): with ``snapshot_dir`` set, every
    version is written there (and named in its manifest) before it is announced; the replicas pull it
    themselves once the latest version names it (``services/rollout/weights/``), so there is nothing to send."""

    name = "snapshot"

    async def stage(self, manifest: Manifest) -> Manifest:
        s = self.settings
        if not s.snapshot_dir:
            return manifest
        await asyncio.to_thread(self.outbox.finish)  # (every bucket: a snapshot implies copies)
        box = self.outbox
        # files are written from host memory: GPU buckets are staged through pinned host buffers first
        host = await asyncio.to_thread(lambda: [box.host_copy(i) for i in range(len(manifest.buckets))])
        snapshot = await asyncio.to_thread(write_snapshot, s.snapshot_dir, manifest.version, manifest.buckets,
                                           host, s.snapshot_url, s.snapshot_keep)
        return manifest.model_copy(update={"snapshot": snapshot})

    async def deliver(self, replicas: list[ReplicaInfo], shipment: Shipment) -> None:
        """Nothing to send: these replicas fetch the files :meth:`stage` wrote."""
