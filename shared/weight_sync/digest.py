"""Bucket digests, by name (a registry): a receiver recomputes the digest of every bucket it received and
refuses the version if one differs from the publisher's (:class:`~shared.weight_sync.wire.Checksums`).

- ``xxh3_64`` (the default on CPUs) runs at memory speed (~17 GB/s on one core here), so a digest per
  bucket costs a few milliseconds per GB, computed while the next bucket is on the wire.
- ``wsum64`` (the default between GPUs) is computed where the bucket lives, with torch: a position-weighted
  sum of its 64-bit words with odd weights, modulo 2^64. Any change to a single word changes it, and so
  does moving a word; it is not a cryptographic hash (nothing here defends against an adversary, only
  against corruption and layout bugs). It keeps an NCCL bucket on the GPU instead of copying it to the host
  to digest it; on a CPU it gives the same value as on a GPU, only more slowly than xxh3.
- ``crc32`` is kept for setups that want zlib only (~2-5 GB/s).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import xxhash

_K1, _K2 = 0x9E3779B97F4A7C15 - (1 << 64), 0x632BE59BD9B4E019  # golden-ratio and pi-derived odd constants
_CHUNK_WORDS = 1 << 21  # 16 MiB of words per step bounds the temporaries


def _host(fn: Callable[[memoryview], int]) -> Callable[[Any], int]:
    def run(buf: Any) -> int:
        host = buf if buf.device.type == "cpu" else buf.cpu()
        return fn(memoryview(host.numpy()))

    return run


def wsum64(buf: Any, chunk_words: int = _CHUNK_WORDS) -> int:
    """Position-weighted wrapping sum of a flat uint8 torch buffer's 64-bit words, on the buffer's device."""
    import torch

    n = buf.numel()
    whole = n - n % 8
    body = buf[:whole]
    if whole and body.data_ptr() % 8:
        body = body.clone()  # int64 views need 8-byte alignment
    words = body.view(torch.int64)
    total = torch.zeros((), dtype=torch.int64, device=buf.device)
    base = _base_weights(buf.device, min(chunk_words, words.numel()))
    for start in range(0, words.numel(), chunk_words):
        part = words[start:start + chunk_words]
        # weight of word i: (i * K1 + K2) | 1, with i = start + j: base[j] = j * K1 + K2, plus start * K1 (mod 2^64)
        w = base[:part.numel()] + _signed64(start * _K1)
        total += (part * w.bitwise_or_(1)).sum()
    h = int(total) & ((1 << 64) - 1)
    for i, byte in enumerate(buf[whole:].tolist()):  # at most 7 trailing bytes
        h = (h ^ ((byte + 1) << (8 * i))) * 0x100000001B3 & ((1 << 64) - 1)
    return h ^ n


_BASES: dict[tuple[str, int], Any] = {}


def _signed64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def _base_weights(device: Any, n: int) -> Any:
    """``j * K1 + K2`` for j < n (int64, wrapping) on ``device``, made once per device and size (a digest of
    a GPU bucket then runs two kernels a chunk instead of five)."""
    import torch

    key = (str(device), n)
    base = _BASES.get(key)
    if base is None:
        base = torch.arange(n, dtype=torch.int64, device=device).mul_(_K1).add_(_K2)
        _BASES.clear()  # one size per device in practice (the chunk); keep memory bounded
        _BASES[key] = base
    return base


ALGORITHMS: dict[str, Callable[[Any], int]] = {
    "xxh3_64": _host(xxhash.xxh3_64_intdigest),
    "crc32": _host(zlib.crc32),
    "wsum64": wsum64,
}


def digest(buf: Any, algo: str) -> int:
    """Digest of a flat uint8 torch buffer's bytes."""
    fn = ALGORITHMS.get(algo)
    if fn is None:
        raise ValueError(f"unknown checksum algorithm {algo!r}; known: {sorted(ALGORITHMS)}")
    return fn(buf)
