"""Bucket digests: every registered algorithm catches corruption; wsum64 is the same on any device."""

import pytest
import torch

from shared.weight_sync.digest import ALGORITHMS, digest, wsum64
from shared.weight_sync.settings import WeightSyncSettings


@pytest.fixture(scope="module")
def bucket() -> torch.Tensor:
    return torch.randint(0, 256, (1 << 16,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_digest_changes_with_any_flipped_bit_and_moved_word(algo, bucket):
    base = digest(bucket, algo)
    assert digest(bucket.clone(), algo) == base
    for pos, bit in ((0, 0), (777, 3), (len(bucket) - 1, 7), (len(bucket) // 2, 7)):
        bad = bucket.clone()
        bad[pos] ^= 1 << bit
        assert digest(bad, algo) != base, (pos, bit)
    swapped = bucket.clone()
    swapped[:8], swapped[8:16] = bucket[8:16].clone(), bucket[:8].clone()
    assert digest(swapped, algo) != base
    assert digest(bucket[:-3], algo) != base  # length matters


def test_wsum64_does_not_depend_on_chunking_alignment_or_odd_lengths(bucket):
    assert wsum64(bucket) == wsum64(bucket, chunk_words=100) == wsum64(bucket, chunk_words=1)
    odd = bucket[:1001]
    assert wsum64(odd) == wsum64(odd.clone()) != wsum64(bucket[:1000])
    misaligned = bucket[3:3 + 4096]  # not 8-byte aligned: digested from an aligned copy, same value
    assert wsum64(misaligned) == wsum64(misaligned.clone())


def test_auto_picks_a_digest_that_stays_on_the_device():
    assert WeightSyncSettings(backend="gloo").digest_algo == "xxh3_64"
    assert WeightSyncSettings(backend="nccl").digest_algo == "wsum64"
    assert WeightSyncSettings(backend="nccl", checksum_algo="crc32").digest_algo == "crc32"


@pytest.mark.gpu
def test_wsum64_on_the_gpu_equals_the_cpu_value(bucket):
    big = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    for buf in (bucket, big, big[5:]):
        assert wsum64(buf.cuda()) == wsum64(buf)
