"""Delta patches: a bucket's changed elements since a base version, encoded compactly (both sides use this).

A bucket is compared as a flat array of *units* (:func:`unit_size`: the largest element width that every
tensor of the bucket is a multiple of, so a bf16 bucket compares 2-byte words and an fp32 bucket 4-byte
words). A patch lists the positions of the units that differ from the base and their new bytes:

    header (32 bytes) | positions (codec-encoded) | values (k * unit bytes, in position order)

The positions are stored by whichever of these codecs is smallest for that bucket (sizes are computed
exactly before encoding; all encode and decode vectorised with numpy):

- ``varint``: the gaps between positions (``pos[i] - pos[i-1] - 1``) as LEB128 bytes: 1 byte per gap below
  128, which is where RL updates sit (1-5 % of the units change, so the median gap is 20-100);
- ``gap16``: the gaps as uint16, a gap of 65535 or more written as runs of 65535 (each adds 65535 to the next);
- ``index32``: absolute positions as uint32 (buckets of at most 2^32 units);
- ``bitmask``: one bit per unit (wins once more than ~1/16 of the units change at 2-byte units).

Measured on ``benchmarks/weight_delta.py`` (bf16, AdamW, docs/benchmarks.md): which codec won and the
bytes each would have taken are printed per round. A patch that would not be smaller than the bucket is
not sent: the bucket goes whole (:func:`make_patch` returns None).

torch and numpy are imported inside the functions (``shared`` imports without them). Devices: the diff runs
on the device the buffers live on (a GPU bucket is compared on the GPU); the encoding runs on the host with
only the changed positions and values moved there; :func:`apply_patch` writes into a buffer on any device.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAGIC = b"FRD1"
HEADER = struct.Struct("<4sBBxxQQQ")  # magic, codec, unit, (pad), units in bucket, changed units, position bytes
CODECS = ("varint", "gap16", "index32", "bitmask")
_UNIT_DTYPES = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_G16 = 0xFFFF


PIECE_BYTES = 32 << 20  # a delta round patches buckets in pieces of this size (the last piece of a bucket shorter)


def pieces(sizes: Sequence[int], piece_bytes: int) -> list[tuple[int, int, int]]:
    """A delta round's pieces: ``(bucket, start, end)`` byte ranges, in bucket order, cutting each bucket of
    ``sizes`` every ``piece_bytes`` (a multiple of 8, so every piece starts on a unit boundary); ``piece_bytes`` 0:
    whole buckets. Both sides cut the same pieces from the manifest and the round's ``piece_bytes``."""
    if piece_bytes < 0 or piece_bytes % 8:
        raise PatchError(f"piece size {piece_bytes} is not a multiple of 8 bytes")
    out: list[tuple[int, int, int]] = []
    for i, n in enumerate(sizes):
        step = piece_bytes or max(n, 1)
        out.extend((i, lo, min(lo + step, n)) for lo in range(0, max(n, 1), step))
    return out


class PatchError(ValueError):
    """A patch that does not fit the bucket it is applied to (corrupt, truncated, another layout)."""


def unit_size(dtype_sizes: Sequence[int], nbytes: int) -> int:
    """The width (bytes) a bucket is compared in: the largest of 8, 4, 2, 1 dividing every element size and
    the bucket's length (tensors sit back to back, so every tensor starts on such a boundary)."""
    for unit in (8, 4, 2):
        if nbytes % unit == 0 and all(s % unit == 0 for s in dtype_sizes):
            return unit
    return 1


def _units(buf: Any, unit: int) -> Any:
    """A flat uint8 torch buffer viewed as ``unit``-byte integers (on its own device)."""
    import torch

    if unit > 1 and buf.data_ptr() % unit:
        raise PatchError(f"buffer not aligned to {unit} bytes")
    return buf.view(getattr(torch, _UNIT_DTYPES[unit]))


def diff(new: Any, base: Any, unit: int) -> tuple[Any, Any]:
    """Positions (int64, on the buffers' device) of the units where ``new`` differs from ``base``, and the new
    units there. Both flat uint8 torch buffers of one length on one device."""
    if new.numel() != base.numel():
        raise PatchError(f"bucket is {new.numel()} bytes, its base {base.numel()}")
    if new.device != base.device:  # never a silent cross-device compare (or a CUDA buffer reaching numpy below)
        raise PatchError(f"bucket on {new.device}, its base on {base.device}: stage them on one device first")
    import torch

    a, b = _units(new, unit), _units(base, unit)
    if new.device.type == "cpu":
        pos, vals = diff_host(a.numpy(), b.numpy())
        return torch.from_numpy(pos), torch.from_numpy(vals)
    return diff_device(a, b)  # on the GPU: compared where the bucket lives


def diff_device(a: Any, b: Any) -> tuple[Any, Any]:
    """:func:`diff` with torch ops on the units' own device (a GPU bucket): positions (int64) and the new units
    there, both on that device. Runs on CPU tensors too, which is how tests check it against :func:`diff_host`
    on a machine without a GPU."""
    pos = (a != b).nonzero().squeeze(1)
    return pos, a[pos]


_scratch = threading.local()  # per thread: the compare's bool mask, reused chunk after chunk
_CHUNK_WORDS = 1 << 16  # 8-byte words compared per chunk: 512 KiB of each buffer, so the second pass hits the cache


def _mask(n: int) -> Any:
    """A reusable bool array of ``n`` elements (a fresh mask per bucket would fault in its pages every time)."""
    import numpy as np

    m = getattr(_scratch, "mask", None)
    if m is None or len(m) < n:
        m = _scratch.mask = np.empty(n, dtype=bool)
    return m[:n]


def diff_host(a: Any, b: Any) -> tuple[Any, Any]:
    """:func:`diff` on host numpy arrays of units (int8/16/32/64 views of the two buffers): positions (int64) and
    the new units there.

    Compared as 8-byte words, 512 KiB at a time: one ``!=`` over the words and one ``flatnonzero`` of that mask
    (a quarter of the elements a bf16 compare scans), then only the changed words are split into their units
    (their XOR with the base, viewed as units). Measured on a 64 MiB bf16 bucket with 3 % of the units changed
    (one thread, docs/benchmarks.md "Weight delta"): 16.5 ms against 26.4 ms for one compare of every unit and
    one ``flatnonzero`` over 32M bools (which spent two thirds of its time in ``flatnonzero``); whole-bucket
    word compares without chunks took 20.9 ms (the gathers of the changed words then miss the cache)."""
    import numpy as np

    unit = a.itemsize
    lanes = 8 // unit
    n = len(a)
    words = n // lanes if unit < 8 else n
    if len(b) != n or a.dtype != b.dtype:
        raise PatchError("buffers differ in length or unit")
    pos_parts: list[Any] = []
    val_parts: list[Any] = []
    a64 = a[:words * lanes].view(np.int64)
    b64 = b[:words * lanes].view(np.int64)
    m = _mask(min(_CHUNK_WORDS, max(words, 1)))
    shift = lanes.bit_length() - 1  # log2(lanes)
    for s in range(0, words, _CHUNK_WORDS):
        aw_all, bw_all = a64[s:s + _CHUNK_WORDS], b64[s:s + _CHUNK_WORDS]
        mk = m[:len(aw_all)]
        np.not_equal(aw_all, bw_all, out=mk)
        w = np.flatnonzero(mk)
        if not len(w):
            continue
        if lanes > 1 and 4 * len(w) > len(aw_all):  # dense: splitting many words costs more than a unit compare
            ua, ub = a[s * lanes:(s + len(aw_all)) * lanes], b[s * lanes:(s + len(aw_all)) * lanes]
            um = _mask(len(ua) + _CHUNK_WORDS)[_CHUNK_WORDS:]
            np.not_equal(ua, ub, out=um)
            q = np.flatnonzero(um)
            val_parts.append(ua.take(q))
            q += s * lanes
            pos_parts.append(q)
            continue
        aw = aw_all.take(w)
        if lanes == 1:
            w += s
            pos_parts.append(w)
            val_parts.append(aw)
            continue
        x = aw ^ bw_all.take(w)
        q = np.flatnonzero(x.view(a.dtype) != 0)  # (a bool mask: numpy's fast flatnonzero)
        p = w[q >> shift]
        p += s
        p <<= shift
        p |= q & (lanes - 1)
        pos_parts.append(p)
        val_parts.append(aw.view(a.dtype).take(q))
    if words * lanes < n:  # a tail shorter than a word
        ta, tb = a[words * lanes:], b[words * lanes:]
        q = np.flatnonzero(ta != tb)
        pos_parts.append(q + words * lanes)
        val_parts.append(ta.take(q))
    if not pos_parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=a.dtype)
    if len(pos_parts) == 1:
        return pos_parts[0], val_parts[0]
    return np.concatenate(pos_parts), np.concatenate(val_parts)


# ---- position codecs (numpy, host) -----------------------------------------------------------------------
def _gaps(pos: Any) -> Any:
    import numpy as np

    g = np.empty(len(pos), dtype=np.int64)
    if len(pos):
        g[0] = pos[0]
        np.subtract(pos[1:], pos[:-1], out=g[1:])
        g[1:] -= 1
    return g


def _ungap(g: Any) -> Any:
    import numpy as np

    pos = np.cumsum(g + 1, dtype=np.int64)
    pos -= 1
    return pos


def _varint_len(g: Any) -> Any:
    """LEB128 bytes of each gap: 1 + how many of 2^7, 2^14, ... it reaches (one compare per length present)."""
    import numpy as np

    n = np.ones(len(g), dtype=np.int64)
    top = int(g.max()) if len(g) else 0
    shift = 7
    while top >> shift:
        n += g >= (1 << shift)
        shift += 7
    return n


def codec_sizes(pos: Any, n_units: int) -> dict[str, int]:
    """Bytes each codec takes for these (host numpy, int64, ascending) positions."""
    return _sizes(_gaps(pos), n_units)


def _sizes(g: Any, n_units: int) -> dict[str, int]:
    import numpy as np

    k = len(g)
    top = int(g.max()) if k else 0
    varint = k
    shift = 7
    while top >> shift:
        varint += int(np.count_nonzero(g >= (1 << shift)))
        shift += 7
    escapes = int((g[g >= _G16] // _G16).sum()) if top >= _G16 else 0
    return {"varint": varint, "gap16": 2 * (k + escapes), "index32": 4 * k, "bitmask": (n_units + 7) // 8}


def encode_positions(codec: str, pos: Any, n_units: int, gaps: Any = None) -> bytes:
    """``pos`` (host numpy, int64, ascending) in ``codec``; ``gaps``: their :func:`_gaps` when already made."""
    import numpy as np

    if codec == "index32":
        return pos.astype("<u4").tobytes()
    if codec == "bitmask":
        mask = np.zeros(n_units, dtype=np.uint8)
        mask[pos] = 1
        return np.packbits(mask, bitorder="little").tobytes()
    g = _gaps(pos) if gaps is None else gaps
    if codec == "gap16":
        if not len(g) or int(g.max()) < _G16:
            return g.astype("<u2").tobytes()
        q, r = np.divmod(g, _G16)
        reps = q + 1  # q escape tokens, then the remainder
        out = np.full(int(reps.sum()), _G16, dtype="<u2")
        ends = np.cumsum(reps) - 1
        out[ends] = r
        return out.tobytes()
    if codec == "varint":
        # every gap's low 7 bits as one byte; the few gaps of 128 or more (~4 % at 2.5 % changed) get the
        # continuation bit, and their further bytes are inserted after them in one pass (np.insert keeps the
        # given order for equal indices: level 1, then 2, ...)
        long = np.flatnonzero(g >= 0x80)
        if not len(long):
            return g.astype(np.uint8).tobytes()
        out = (g & 0x7F).astype(np.uint8)
        out[long] |= 0x80
        at, extra = [], []
        j, sel = 1, long
        while len(sel):
            v = g[sel] >> (7 * j)
            nxt = v >= 0x80
            at.append(sel + 1)
            extra.append(((v & 0x7F) | np.where(nxt, 0x80, 0)).astype(np.uint8))
            sel = sel[nxt]
            j += 1
        at_all = np.concatenate(at)
        order = np.argsort(at_all, kind="stable")
        return np.insert(out, at_all[order], np.concatenate(extra)[order]).tobytes()
    raise PatchError(f"unknown position codec {codec!r}")


def decode_positions(codec: str, raw: memoryview | bytes, k: int, n_units: int) -> Any:
    import numpy as np

    if codec == "index32":
        pos = np.frombuffer(raw, dtype="<u4").astype(np.int64)
    elif codec == "bitmask":
        bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little", count=n_units)
        pos = np.flatnonzero(bits.view(np.bool_)).astype(np.int64, copy=False)  # (bool: numpy's fast nonzero, ~8x)
    elif codec == "gap16":
        tok = np.frombuffer(raw, dtype="<u2").astype(np.int64)
        ends = np.flatnonzero(tok != _G16)
        if len(ends) != k or (len(tok) and ends[-1:].tolist() != [len(tok) - 1]):
            raise PatchError("gap16 positions do not end where the count says")
        csum = np.cumsum(tok)
        g = csum[ends] - np.concatenate(([0], csum[ends[:-1]]))
        pos = _ungap(g)
    elif codec == "varint":
        b = np.frombuffer(raw, dtype=np.uint8)
        cont = np.flatnonzero(b >= 0x80)  # continuation bytes: few (gaps of 128 or more)
        if len(b) - len(cont) != k or (len(b) and b[-1] >= 0x80):
            raise PatchError("varint positions do not end where the count says")
        g = b.astype(np.int64)
        if len(cont):
            g[cont] -= 0x80
            # a run of continuation bytes c, c+1, ... belongs to the gap whose first byte starts the run; each
            # byte after a continuation byte adds its 7 bits at its depth in the run, into that first byte
            first = np.ones(len(cont), dtype=bool)
            first[1:] = cont[1:] != cont[:-1] + 1
            run = np.flatnonzero(first)
            depth = np.arange(len(cont)) - np.repeat(run, np.diff(np.append(run, len(cont))))
            if len(depth) and depth.max() > 7:
                raise PatchError("varint gap too long")
            head = cont[run][np.repeat(np.arange(len(run)), np.diff(np.append(run, len(cont))))]
            for d in range(int(depth.max()) + 1):  # heads are distinct within one depth
                at = depth == d
                g[head[at]] += g[cont[at] + 1] << (7 * (d + 1))
            if int(g.min()) < 0:
                raise PatchError("varint gap too long")
            keep = np.ones(len(b), dtype=bool)
            keep[cont + 1] = False  # the bytes folded into their gap's first byte
            g = g[keep]
        if k and int(g.max()) >= n_units:
            raise PatchError("patch positions out of the bucket")
        pos = _ungap(g)
    else:
        raise PatchError(f"unknown position codec {codec!r}")
    if len(pos) != k:
        raise PatchError(f"patch lists {len(pos)} positions, its header {k}")
    if k and (pos[-1] >= n_units or pos[0] < 0):
        raise PatchError("patch positions out of the bucket or not ascending")
    if codec == "index32" and k > 1 and (np.diff(pos) <= 0).any():  # (gaps and bits ascend by construction)
        raise PatchError("patch positions out of the bucket or not ascending")
    return pos


# ---- patches ---------------------------------------------------------------------------------------------
@dataclass
class Patch:
    """One bucket's patch: the encoded bytes, and what it holds (for reports and the benchmark)."""

    data: Any  # the patch: a uint8 numpy array (bytes-like: len(), bytes(), memoryview())
    changed: int  # units that differ
    units: int  # units in the bucket
    codec: str
    sizes: dict[str, int]  # position bytes of every codec (what the choice was made from)
    positions: Any = None  # the changed positions (int64 torch, the buffers' device): the publisher's own base
    values: Any = None  # their new units (same device), so the base is patched without decoding
    unit: int = 0  # bytes a unit


def make_patch(new: Any, base: Any, unit: int, codec: str | None = None) -> Patch | None:
    """The patch that turns ``base`` into ``new`` (flat uint8 torch buffers, one device), or None when it
    would not be smaller than the bucket itself (send it whole). ``codec``: force one (tests, benchmark).

    One compare (:func:`diff`), the gaps made once and used for the sizes and the encoding, and the patch
    written into one array (header, positions, values): no Python loop over positions, no bytes joined."""
    import numpy as np

    pos_t, vals_t = diff(new, base, unit)
    n_units = new.numel() // unit
    pos = pos_t.cpu().numpy().astype(np.int64, copy=False)
    g = _gaps(pos)
    sizes = _sizes(g, n_units)
    if codec is None:
        codec = min(CODECS, key=lambda c: sizes[c])
    k = len(pos)
    total = HEADER.size + sizes[codec] + k * unit
    if total >= new.numel():
        return None
    data = np.empty(total, dtype=np.uint8)
    data[:HEADER.size] = np.frombuffer(HEADER.pack(MAGIC, CODECS.index(codec), unit, n_units, k, sizes[codec]),
                                       dtype=np.uint8)
    body = encode_positions(codec, pos, n_units, gaps=g)
    data[HEADER.size:HEADER.size + len(body)] = np.frombuffer(body, dtype=np.uint8)
    vals = vals_t.cpu().numpy()  # the units' bytes, little-endian as on the wire
    data[HEADER.size + len(body):] = vals.view(np.uint8)
    return Patch(data=data, changed=k, units=n_units, codec=codec, sizes=sizes, positions=pos_t, values=vals_t,
                 unit=unit)


def _host_bytes(data: Any) -> memoryview:
    """A patch's bytes as a memoryview: bytes, bytearray, memoryview, a uint8 numpy array or a torch tensor
    (copied to the host first when it lives on a GPU)."""
    if hasattr(data, "numpy"):  # a torch tensor
        data = data.cpu().numpy() if data.device.type != "cpu" else data.numpy()
    return memoryview(data).cast("B")


def read_patch(data: Any, nbytes: int) -> tuple[int, Any, memoryview]:
    """Parse a patch for a bucket of ``nbytes``: (unit, positions as int64 numpy, values bytes). Raises
    :class:`PatchError` on anything that does not fit."""
    data = _host_bytes(data)
    if len(data) < HEADER.size:
        raise PatchError(f"patch of {len(data)} bytes is shorter than its header")
    magic, codec_id, unit, n_units, k, pos_bytes = HEADER.unpack_from(data)
    if magic != MAGIC or codec_id >= len(CODECS) or unit not in _UNIT_DTYPES:
        raise PatchError("not a weight patch (magic, codec or unit)")
    if n_units * unit != nbytes:
        raise PatchError(f"patch is for a bucket of {n_units * unit} bytes, this one has {nbytes}")
    if HEADER.size + pos_bytes + k * unit != len(data):
        raise PatchError(f"patch is {len(data)} bytes, its header says {HEADER.size + pos_bytes + k * unit}")
    body = data[HEADER.size:HEADER.size + pos_bytes]
    pos = decode_positions(CODECS[codec_id], body, k, n_units)
    return unit, pos, data[HEADER.size + pos_bytes:]


def _scatter(buf: Any, unit: int, pos: Any, vals: Any) -> None:
    """``buf``'s units at ``pos`` become ``vals`` (host numpy arrays, as decoded): numpy's fancy assignment on a
    host buffer (no torch index tensors made from them), torch's on a GPU one."""
    units = _units(buf, unit)
    if buf.device.type == "cpu":
        units.numpy()[pos] = vals
    else:
        scatter_device(units, pos, vals)


def scatter_device(units: Any, pos: Any, vals: Any) -> None:
    """:func:`_scatter` into a buffer on a torch device (a GPU one): the decoded host arrays copied to the device
    explicitly, then torch's indexed assignment there. Runs on a CPU buffer too (tests, no GPU here)."""
    import numpy as np
    import torch

    where = torch.from_numpy(np.ascontiguousarray(pos, dtype=np.int64)).to(units.device)
    new = torch.from_numpy(np.array(vals, dtype=vals.dtype, copy=True)).to(units.device)  # (vals may be read-only)
    units[where] = new


def apply_diff(buf: Any, patch: Patch, unit: int | None = None) -> None:
    """Write ``patch``'s changed units into ``buf`` straight from its positions and values (the publisher
    advancing its own base; no decoding)."""
    unit = unit or patch.unit
    if patch.positions.device.type == "cpu" and buf.device.type == "cpu":
        _units(buf, unit).numpy()[patch.positions.numpy()] = patch.values.numpy()
        return
    _units(buf, unit)[patch.positions.to(buf.device)] = patch.values.to(buf.device)


def apply_patch(buf: Any, data: Any) -> int:
    """Write a patch into ``buf`` (a flat uint8 torch buffer holding the base, any device): returns the units
    changed. ``data``: bytes-like or a uint8 torch tensor. Checks the patch fully before writing anything."""
    import numpy as np

    unit, pos, vals = read_patch(data, buf.numel())
    if not len(pos):
        return 0
    _scatter(buf, unit, pos, np.frombuffer(vals, dtype=_UNIT_DTYPES[unit]))
    return len(pos)
