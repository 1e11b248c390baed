"""Delta patches (shared/weight_sync/delta.py): every codec round-trips, empty and all-changed buckets, bf16 and
fp32 units, and a corrupt patch is refused before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.weight_sync import delta as D


def _bucket(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g).to(dtype).view(torch.uint8).clone()


def _changed(base: torch.Tensor, dtype: torch.dtype, frac: float, seed: int = 1) -> torch.Tensor:
    vals = base.view(dtype).clone()
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(vals.numel(), generator=g) < frac
    vals[mask] = (vals[mask].float() * 1.5 + 0.25).to(dtype)  # changes every masked value's bits
    return vals.view(torch.uint8)


@pytest.mark.parametrize("codec", D.CODECS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_codec_round_trips(codec, dtype):
    base = _bucket(20_000, dtype)
    new = _changed(base, dtype, 0.03)
    patch = D.make_patch(new, base, dtype.itemsize, codec=codec)
    assert patch is not None and patch.codec == codec
    assert patch.changed == int((new.view(dtype) != base.view(dtype)).sum())
    out = base.clone()
    assert D.apply_patch(out, patch.data) == patch.changed
    assert torch.equal(out, new)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64])
def test_the_word_compare_finds_exactly_the_changed_units(dtype):
    # diff_host compares 8-byte words in chunks and splits only the changed words into units: it must list what a
    # plain per-unit compare lists, across chunk edges, a tail shorter than a word, no change and every change
    rng = np.random.default_rng(3)
    lanes = 8 // np.dtype(dtype).itemsize
    for n in (0, 1, lanes + 1, 1000, D._CHUNK_WORDS * lanes + 3, 2 * D._CHUNK_WORDS * lanes + 1):
        for frac in (0.0, 0.03, 0.4, 1.0):
            base = rng.integers(-100, 100, n).astype(dtype)
            new = base.copy()
            k = int(n * frac)
            new[rng.choice(n, k, replace=False) if k else []] += 1
            new[-1:] += 1  # the last unit (in the tail where there is one)
            pos, vals = D.diff_host(new, base)
            want = np.flatnonzero(new != base)
            assert pos.dtype == np.int64 and vals.dtype == new.dtype
            assert np.array_equal(pos, want) and np.array_equal(vals, new[want]), (n, frac)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64])
def test_the_device_compare_and_scatter_agree_with_the_host_ones(dtype):
    # a GPU bucket is compared and patched with torch ops where it lives (diff_device, scatter_device); no GPU here,
    # so the same functions run on CPU tensors against the host path, incl. no change and read-only decoded values
    rng = np.random.default_rng(5)
    for n in (0, 1, 1000, 70_001):
        for frac in (0.0, 0.03, 1.0):
            base = rng.integers(-100, 100, n).astype(dtype)
            new = base.copy()
            k = int(n * frac)
            new[rng.choice(n, k, replace=False) if k else []] += 1
            pos_t, vals_t = D.diff_device(torch.from_numpy(new), torch.from_numpy(base))
            pos, vals = D.diff_host(new, base)
            assert pos_t.dtype == torch.int64 and vals_t.dtype == torch.from_numpy(new).dtype
            assert np.array_equal(pos_t.numpy(), pos) and np.array_equal(vals_t.numpy(), vals), (n, frac)
            out = torch.from_numpy(base.copy())
            frozen = vals.copy()
            frozen.setflags(write=False)  # as decoded from a received patch (np.frombuffer of its bytes)
            D.scatter_device(out, pos, frozen)
            assert np.array_equal(out.numpy(), new), (n, frac)


def test_positions_round_trip_with_long_gaps():
    # gaps of 0, 127/128 (varint byte boundary), 65534/65535/65536 and beyond (gap16 escapes), 2^21
    pos = np.cumsum(np.array([0, 1, 128, 129, 65535, 65536, 65537, 200_000, 1 << 21], dtype=np.int64))
    n = int(pos[-1]) + 10
    for codec in D.CODECS:
        raw = D.encode_positions(codec, pos, n)
        assert D.codec_sizes(pos, n)[codec] == len(raw), codec
        assert np.array_equal(D.decode_positions(codec, raw, len(pos), n), pos), codec


def test_varint_sizes_by_hand():
    # gaps 0 and 127: one byte each; 128: two bytes; 16384: three bytes
    pos = np.array([0, 128, 257, 16642], dtype=np.int64)
    assert D.codec_sizes(pos, 20_000) == {"varint": 1 + 1 + 2 + 3, "gap16": 8, "index32": 16, "bitmask": 2500}


def test_empty_patch_changes_nothing():
    base = _bucket(4096, torch.bfloat16)
    patch = D.make_patch(base.clone(), base, 2)
    assert patch is not None and patch.changed == 0 and len(patch.data) == D.HEADER.size
    out = base.clone()
    assert D.apply_patch(out, patch.data) == 0 and torch.equal(out, base)


def test_all_changed_bucket_is_sent_whole():
    base = _bucket(4096, torch.bfloat16)
    assert D.make_patch(_changed(base, torch.bfloat16, 1.0), base, 2) is None


def test_the_smallest_codec_is_chosen():
    base = _bucket(100_000, torch.bfloat16)
    sparse = D.make_patch(_changed(base, torch.bfloat16, 0.01), base, 2)
    dense = D.make_patch(_changed(base, torch.bfloat16, 0.3), base, 2)
    assert sparse.codec == "varint" and dense.codec == "bitmask"
    assert len(sparse.data) == D.HEADER.size + sparse.sizes["varint"] + 2 * sparse.changed


def test_unit_size():
    assert D.unit_size([2, 2], 64) == 2 and D.unit_size([4, 2], 64) == 2 and D.unit_size([4], 64) == 4
    assert D.unit_size([1, 4], 64) == 1 and D.unit_size([2], 6) == 2 and D.unit_size([8], 64) == 8


@pytest.mark.parametrize("damage", ["truncate", "magic", "length", "position"])
def test_a_corrupt_patch_is_refused_before_writing(damage):
    base = _bucket(8192, torch.bfloat16)
    new = _changed(base, torch.bfloat16, 0.05)
    data = bytearray(D.make_patch(new, base, 2, codec="index32").data)
    if damage == "truncate":
        data = data[:-3]
    elif damage == "magic":
        data[0] ^= 0xFF
    elif damage == "length":
        data = data + b"\0\0"
    else:  # a position past the end of the bucket
        data[D.HEADER.size:D.HEADER.size + 4] = (10**6).to_bytes(4, "little")
    out = base.clone()
    with pytest.raises(D.PatchError):
        D.apply_patch(out, bytes(data))
    assert torch.equal(out, base)


def test_a_patch_for_another_bucket_size_is_refused():
    base = _bucket(4096, torch.bfloat16)
    patch = D.make_patch(_changed(base, torch.bfloat16, 0.05), base, 2)
    with pytest.raises(D.PatchError, match="bucket of"):
        D.apply_patch(torch.zeros(4094, dtype=torch.uint8), patch.data)


@pytest.mark.parametrize("codec", D.CODECS)
def test_positions_round_trip_random_gap_mixtures(codec):
    # mostly short gaps with some long ones of every varint length (1-4 bytes), in runs and alone: the encoders'
    # and decoders' vectorised paths for long gaps against a plain Python LEB128 reference
    rng = np.random.default_rng(7)
    gaps = rng.geometric(0.03, size=5000) - 1
    long = rng.choice(len(gaps), size=400, replace=False)
    gaps[long] = rng.integers(0x80, 1 << 22, size=len(long))  # (positions stay below 2^32 for index32)
    gaps[100:110] = [127, 128, 16383, 16384, 65534, 65535, 65536, (1 << 21) - 1, 1 << 21, 1 << 27]
    pos = np.cumsum(gaps + 1) - 1
    n = int(pos[-1]) + 1
    raw = D.encode_positions(codec, pos, n)
    assert D.codec_sizes(pos, n)[codec] == len(raw)
    assert np.array_equal(D.decode_positions(codec, raw, len(pos), n), pos)
    if codec == "varint":
        ref = bytearray()
        for g in gaps.tolist():
            while g >= 0x80:
                ref.append((g & 0x7F) | 0x80)
                g >>= 7
            ref.append(g)
        assert raw == bytes(ref)


def test_a_varint_gap_past_the_bucket_is_refused():
    raw = bytes([0x80 | 5, 0x80, 0x80, 0x01])  # one gap of 5 + 2^21: past a bucket of 1000 units
    with pytest.raises(D.PatchError):
        D.decode_positions("varint", raw, 1, 1000)
    with pytest.raises(D.PatchError):
        D.decode_positions("varint", bytes([0xFF] * 12 + [0x01]), 1, 1000)  # 13 bytes: too long
