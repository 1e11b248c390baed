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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAGIC = b"FRD1"
HEADER = struct.Struct("<4sBBxxQQQ")  # magic, codec, unit, (pad), units in bucket, changed units, position bytes
CODECS = ("varint", "gap16", "index32", "bitmask")
_UNIT_DTYPES = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_G16 = 0xFFFF


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
    if new.device.type == "cpu":  # numpy's compare and flatnonzero: 1.5-2.4x torch's nonzero here (measured)
        import numpy as np

        an = a.numpy()
        pos = np.flatnonzero(an != b.numpy())
        return torch.from_numpy(pos), torch.from_numpy(an[pos])
    pos = (a != b).nonzero().squeeze(1)  # on the GPU: compared where the bucket lives
    return pos, a[pos]


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
    import numpy as np

    n = np.ones(len(g), dtype=np.int64)
    v = g >> 7
    while v.any():
        n += v > 0
        v >>= 7
    return n


def codec_sizes(pos: Any, n_units: int) -> dict[str, int]:
    """Bytes each codec takes for these (host numpy, int64, ascending) positions."""
    g = _gaps(pos)
    k = len(pos)
    return {"varint": int(_varint_len(g).sum()), "gap16": 2 * int(k + (g // _G16).sum()), "index32": 4 * k,
            "bitmask": (n_units + 7) // 8}


def encode_positions(codec: str, pos: Any, n_units: int) -> bytes:
    import numpy as np

    if codec == "index32":
        return pos.astype("<u4").tobytes()
    if codec == "bitmask":
        mask = np.zeros(n_units, dtype=np.uint8)
        mask[pos] = 1
        return np.packbits(mask, bitorder="little").tobytes()
    g = _gaps(pos)
    if codec == "gap16":
        q, r = np.divmod(g, _G16)
        reps = q + 1  # q escape tokens, then the remainder
        out = np.full(int(reps.sum()), _G16, dtype="<u2")
        ends = np.cumsum(reps) - 1
        out[ends] = r
        return out.tobytes()
    if codec == "varint":
        lens = _varint_len(g)
        total = int(lens.sum())
        starts = np.cumsum(lens) - lens
        owner = np.repeat(np.arange(len(g)), lens)
        shift = (np.arange(total) - starts[owner]) * 7
        out = ((g[owner] >> shift) & 0x7F).astype(np.uint8)
        out[np.arange(total) != (starts + lens - 1)[owner]] |= 0x80
        return out.tobytes()
    raise PatchError(f"unknown position codec {codec!r}")


def decode_positions(codec: str, raw: memoryview | bytes, k: int, n_units: int) -> Any:
    import numpy as np

    if codec == "index32":
        pos = np.frombuffer(raw, dtype="<u4").astype(np.int64)
    elif codec == "bitmask":
        bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little", count=n_units)
        pos = np.flatnonzero(bits).astype(np.int64)
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
        ends = np.flatnonzero(b < 0x80)
        if len(ends) != k or (len(b) and ends[-1:].tolist() != [len(b) - 1]):
            raise PatchError("varint positions do not end where the count says")
        starts = np.concatenate(([0], ends[:-1] + 1))
        lens = ends - starts + 1
        if len(lens) and lens.max() > 9:
            raise PatchError("varint gap too long")
        owner = np.repeat(np.arange(k), lens)
        shift = (np.arange(len(b)) - starts[owner]) * 7
        # each gap's 7-bit groups summed: a running sum over all bytes, differenced at each gap's last byte
        csum = np.cumsum((b & 0x7F).astype(np.int64) << shift)
        g = csum[ends] - np.concatenate(([0], csum[ends[:-1]]))
        pos = _ungap(g)
    else:
        raise PatchError(f"unknown position codec {codec!r}")
    if len(pos) != k:
        raise PatchError(f"patch lists {len(pos)} positions, its header {k}")
    if k and (pos[-1] >= n_units or pos[0] < 0 or (k > 1 and (np.diff(pos) <= 0).any())):
        raise PatchError("patch positions out of the bucket or not ascending")
    return pos


# ---- patches ---------------------------------------------------------------------------------------------
@dataclass
class Patch:
    """One bucket's patch: the encoded bytes, and what it holds (for reports and the benchmark)."""

    data: bytes
    changed: int  # units that differ
    units: int  # units in the bucket
    codec: str
    sizes: dict[str, int]  # position bytes of every codec (what the choice was made from)
    positions: Any = None  # the changed positions (int64 torch, the buffers' device): the publisher's own base
    values: Any = None  # their new units (same device), so the base is patched without decoding


def make_patch(new: Any, base: Any, unit: int, codec: str | None = None) -> Patch | None:
    """The patch that turns ``base`` into ``new`` (flat uint8 torch buffers, one device), or None when it
    would not be smaller than the bucket itself (send it whole). ``codec``: force one (tests, benchmark)."""
    import numpy as np

    pos_t, vals_t = diff(new, base, unit)
    n_units = new.numel() // unit
    pos = pos_t.cpu().numpy().astype(np.int64, copy=False)
    sizes = codec_sizes(pos, n_units)
    if codec is None:
        codec = min(CODECS, key=lambda c: sizes[c])
    total = HEADER.size + sizes[codec] + len(pos) * unit
    if total >= new.numel():
        return None
    vals = vals_t.cpu().numpy().tobytes()  # the units' bytes, little-endian as on the wire
    head = HEADER.pack(MAGIC, CODECS.index(codec), unit, n_units, len(pos), sizes[codec])
    data = head + encode_positions(codec, pos, n_units) + vals
    return Patch(data=data, changed=len(pos), units=n_units, codec=codec, sizes=sizes, positions=pos_t, values=vals_t)


def read_patch(data: bytes | memoryview, nbytes: int) -> tuple[int, Any, bytes | memoryview]:
    """Parse a patch for a bucket of ``nbytes``: (unit, positions as int64 numpy, values bytes). Raises
    :class:`PatchError` on anything that does not fit."""
    data = memoryview(data)
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


def apply_diff(buf: Any, patch: Patch, unit: int) -> None:
    """Write ``patch``'s changed units into ``buf`` straight from its positions and values (the publisher
    advancing its own base; no decoding)."""
    _units(buf, unit)[patch.positions.to(buf.device)] = patch.values.to(buf.device)


def apply_patch(buf: Any, data: bytes | memoryview) -> int:
    """Write a patch into ``buf`` (a flat uint8 torch buffer holding the base, any device): returns the units
    changed. Checks the patch fully before writing anything."""
    import numpy as np
    import torch

    unit, pos, vals = read_patch(data, buf.numel())
    if not len(pos):
        return 0
    units = _units(buf, unit)
    idx = torch.from_numpy(pos).to(buf.device)
    src = torch.from_numpy(np.frombuffer(vals, dtype=np.uint8).copy()).view(units.dtype).to(buf.device)
    units[idx] = src
    return len(pos)
