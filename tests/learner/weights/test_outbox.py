"""The publisher's outbox: where each bucket's bytes come from (in place, pooled, retained copies), what is
kept for late joiners, and the digests."""

from __future__ import annotations

import pytest
import torch

from services.learner.weights import packing
from services.learner.weights.outbox import Outbox
from shared.weight_sync.digest import digest
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import Manifest, plan_buckets


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(5)])


def begin(box: Outbox, m: torch.nn.Module, version: int = 1) -> Manifest:
    named = packing.named_tensors(m)
    buckets = tuple(plan_buckets(packing.specs(named), 1050))  # a bucket closes once past 1,050 bytes: one Linear (1,088 bytes) each
    manifest = Manifest(version=version, bucket_bytes=1050, total_bytes=sum(b.nbytes for b in buckets),
                        buckets=buckets, checksum=box.settings.digest_algo)
    box.begin(manifest, dict(named))
    return manifest


def expected_bytes(manifest: Manifest, m: torch.nn.Module) -> list[torch.Tensor]:
    lookup = dict(packing.named_tensors(m))
    return [packing.pack_bucket(b, lookup) for b in manifest.buckets]


def test_pooled_buckets_reuse_a_few_buffers_and_keep_nothing():
    m = model()
    box = Outbox(WeightSyncSettings(retain="none", inflight_buckets=1))  # a pool of two buffers
    assert box.pooling
    manifest = begin(box, m)
    want = expected_bytes(manifest, m)
    n = len(manifest.buckets)
    assert n == 5
    ptrs = set()
    for i in range(n):  # as the send loop goes: pack, digest, (broadcast)
        buf = box.wire_buffer(i)
        assert torch.equal(buf, want[i])
        box.digest(i)
        ptrs.add(buf.untyped_storage().data_ptr())
    assert len(ptrs) == 2                                    # two pool buffers took turns
    assert box.pooled == [False, False, False, True, True]    # the earlier buckets' slots were taken over
    assert not box.packed[0] and box.wire[0] is None
    assert all(b is None for b in box.buffers)               # no host copy retained
    sums = box.checksums()
    assert sums is not None and list(sums.values) == [digest(w, "xxh3_64") for w in want]
    box.finish()
    assert not box.intact()                                   # a late joiner gets the next version

    # the next version reuses the same pool buffers (no allocation) and packs the new values
    with torch.no_grad():
        m[0].weight.add_(1.0)
    manifest2 = begin(box, m, version=2)
    want2 = expected_bytes(manifest2, m)
    buf = box.wire_buffer(0)
    assert buf.untyped_storage().data_ptr() in ptrs and torch.equal(buf, want2[0])
    assert not torch.equal(want2[0], want[0])


def test_pooled_bucket_taken_over_is_packed_again_when_asked_for():
    m = model()
    box = Outbox(WeightSyncSettings(retain="none", inflight_buckets=1))
    manifest = begin(box, m)
    want = expected_bytes(manifest, m)
    for i in range(3):
        box.wire_buffer(i)
    assert not box.packed[0]
    assert torch.equal(box.pack(0), want[0])  # re-packed from the weights while the publish holds them
    assert not box.packed[2]                  # ... taking over bucket 2's slot
    box.release()
    assert torch.equal(box.pack(1), want[1])  # still in its slot
    with pytest.raises(RuntimeError, match="no longer held"):
        box.pack(2)


def test_retained_copies_serve_late_joiners_any_time():
    m = model()
    box = Outbox(WeightSyncSettings(retain="copy"))
    assert not box.pooling
    manifest = begin(box, m)
    want = expected_bytes(manifest, m)
    box.wire_buffer(0)
    box.digest(0)
    box.finish()  # packs and digests the rest
    box.release()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()  # training moves on: the copies still hold version 1
    assert box.intact()
    assert all(torch.equal(box.pack(i), want[i]) for i in range(len(want)))
    assert box.checksums() is not None


def test_auto_retention_follows_the_backend_and_snapshots_need_copies(tmp_path):
    assert Outbox(WeightSyncSettings(backend="nccl")).pooling
    assert not Outbox(WeightSyncSettings(backend="gloo")).pooling
    assert not Outbox(WeightSyncSettings(backend="nccl", snapshot_dir=str(tmp_path))).pooling
    assert not Outbox(WeightSyncSettings(retain="none", snapshot_dir=str(tmp_path))).pooling


def test_in_place_buckets_with_pooling_are_digested_for_late_joiners():
    m = model()
    settings = WeightSyncSettings(retain="none", bucket_bytes=1050)
    box = Outbox(settings)
    named = packing.named_tensors(m)
    packing.flatten_into_buckets(named, plan_buckets(packing.specs(named), 1050))
    box.send_in_place = True
    manifest = begin(box, m)
    box.finish()  # nothing was sent: every bucket is a view, digested
    assert all(box.in_place) and not any(box.pooled) and box.checksums() is not None
    box.release()
    assert box.intact()
    with torch.no_grad():
        m[2].bias.add_(1.0)
    assert not box.intact()  # the weights moved on
    assert len(manifest.buckets) == 5


def test_pack_bucket_checks_the_buffer_size_and_the_tensors():
    m = model()
    named = packing.named_tensors(m)
    bucket = plan_buckets(packing.specs(named), 1050)[0]
    lookup = dict(named)
    with pytest.raises(ValueError, match="holds 1088 bytes"):
        packing.pack_bucket(bucket, lookup, out=torch.empty(1000, dtype=torch.uint8))
    lookup["0.weight"] = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="changed since the manifest"):
        packing.pack_bucket(bucket, lookup)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_packs_gpu_weights_on_the_gpu():
    m = model().cuda().to(torch.bfloat16)
    box = Outbox(WeightSyncSettings(backend="nccl"))  # retain auto: pooled on the weights' device
    manifest = begin(box, m)
    cpu = model().to(torch.bfloat16)
    cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    want = expected_bytes(manifest, cpu)
    for i in range(len(manifest.buckets)):
        buf = box.wire_buffer(i)
        assert buf.device.type == "cuda"           # no trip through host memory
        box.digest(i)
        assert torch.equal(buf.cpu(), want[i])
    sums = box.checksums()
    assert sums is not None and sums.algo == "wsum64"
    assert list(sums.values) == [digest(w, "wsum64") for w in want]  # same digest as on the host


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_host_weights_go_through_pinned_slots_reused_only_after_their_upload():
    m = model()  # host weights (e.g. ZeRO-3 gathered to the host), published over nccl
    box = Outbox(WeightSyncSettings(backend="nccl", inflight_buckets=1))
    manifest = begin(box, m)
    want = expected_bytes(manifest, m)
    sent = []
    for i in range(len(manifest.buckets)):  # slots are reused while earlier uploads may still be in flight
        out = box.wire_buffer(i)
        assert out.device.type == "cuda" and box.pool_pinned()
        sent.append(out)
    torch.cuda.synchronize()
    assert all(torch.equal(s.cpu(), w) for s, w in zip(sent, want))
