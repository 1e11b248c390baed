"""Reading the snapshot transport's files (written by the learner's ``services/learner/weights/snapshot.py``):
one safetensors file per bucket per version, from a shared path or over HTTP, each checked against the CRC32
the manifest's :class:`~shared.weight_sync.wire.SnapshotInfo` gives, then read with the ``safetensors``
library (no pickle)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.weight_sync.wire import SnapshotInfo


class SnapshotError(RuntimeError):
    """A snapshot file is missing, unreadable or does not match its checksum."""


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
