"""Bucket digests, by name (a registry): a receiver recomputes the digest of every bucket it received and
refuses the version if one differs from the publisher's (:class:`~shared.weight_sync.wire.Checksums`).

``xxh3_64`` (the default) runs at memory speed (~20 GB/s on one core), so a digest per bucket costs a
few milliseconds per GB, computed while the next bucket is still on the wire. ``crc32`` is kept for
setups that want zlib only (~5 GB/s)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import xxhash

ALGORITHMS: dict[str, Callable[[memoryview], int]] = {
    "xxh3_64": xxhash.xxh3_64_intdigest,
    "crc32": zlib.crc32,
}


def digest(buf: Any, algo: str) -> int:
    """Digest of a flat uint8 torch buffer's bytes (copied to the host first if it lives on a GPU)."""
    fn = ALGORITHMS.get(algo)
    if fn is None:
        raise ValueError(f"unknown checksum algorithm {algo!r}; known: {sorted(ALGORITHMS)}")
    host = buf if buf.device.type == "cpu" else buf.cpu()
    return fn(memoryview(host.numpy()))
