"""Delta rounds (issue 38) between a publisher in this process and real rollout processes (hf engine, tiny model),
gloo on CPU, a real Redis: after many delta rounds each replica's weights are bit-equal to the learner's wire
bytes, and a corrupted patch, a replica that missed versions, and a replica restarted mid-run (joining from a
peer) each get the version whole and end bit-equal too."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import torch

from services.learner.weights import WeightPublisher
from services.learner.weights import collective as C
from services.learner.weights import packing as T
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync.delta import HEADER
from tests.weight_sync.conftest import TOKEN, new_weights, wait_ready, wait_registered
from tests.weight_sync.test_publish_hf import FAST

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def nudge(model: torch.nn.Module, step: int, frac: float = 0.02) -> None:
    """A sparse 'optimizer step': ``frac`` of every tensor's elements move a little (the rest keep their bits)."""
    g = torch.Generator().manual_seed(1000 + step)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < frac
            p.add_(mask * torch.randn(p.shape, generator=g) * 1e-3)


async def assert_bit_equal(pub: WeightPublisher, model: torch.nn.Module, reps: list) -> None:
    """Every replica's bytes of every bucket (the peer route packs them from its model) equal the learner's."""
    manifest = pub.outbox.manifest
    lookup = dict(T.named_tensors(model))
    async with httpx.AsyncClient(timeout=30, headers=AUTH) as c:
        for b in manifest.buckets:
            want = T.pack_bucket(b, lookup).numpy().tobytes()
            for rep in reps:
                r = await c.get(f"{rep.url}/weights/peer/{manifest.version}/{b.index}")
                assert r.status_code == 200, r.text
                assert r.content == want, f"{rep.url} bucket {b.index} differs at version {manifest.version}"


def kinds(pub: WeightPublisher) -> set[str]:
    return set(pub.last_report.round_bytes)


async def test_delta_rounds_stay_bit_equal_and_every_fault_gets_a_full_round(replicas, redis_client, tiny_model_dir,
                                                                              monkeypatch):
    run = "delta"
    a, b = replicas(run), replicas(run)
    await wait_registered(redis_client, run, 2)
    model = new_weights(tiny_model_dir)
    settings = WeightSyncSettings(bucket_bytes=64 << 10, **FAST)
    async with WeightPublisher(redis_client, run, settings) as pub:
        assert await pub.publish(model) == 1
        assert kinds(pub) == {"full"} and len(pub.last_report.loaded) == 2
        full_bytes = pub.last_report.round_bytes["full"]

        # 20 delta rounds: each sends a small fraction of the bytes, and every replica ends on the learner's bytes
        for step in range(20):
            nudge(model, step)
            await pub.publish(model)
            report = pub.last_report
            assert kinds(pub) == {"delta"} and sorted(report.loaded) == sorted(pub.delta.level), report
            assert report.round_bytes["delta"] < 0.2 * full_bytes, report.round_bytes
            assert 0.005 < report.changed_fraction < 0.05, report.changed_fraction
        assert pub.delta.version == 21
        await assert_bit_equal(pub, model, [a, b])

        # a patch corrupted on the way (values flipped after the digests were taken): refused, sent whole, level
        real = C.patch_tensor

        def corrupt(data: bytes, backend: str):
            t = real(data, backend)
            if t.numel() > HEADER.size + 8:
                t[-2:] ^= 0xFF
            return t

        monkeypatch.setattr(C, "patch_tensor", corrupt)
        nudge(model, 100)
        assert await pub.publish(model) == 22
        report = pub.last_report
        assert kinds(pub) == {"delta", "full"} and len(report.loaded) == 2 and not report.refused, report
        assert any("refused" in e and "checksum" in e for e in report.errors), report.errors
        monkeypatch.setattr(C, "patch_tensor", real)
        await assert_bit_equal(pub, model, [a, b])
        nudge(model, 101)
        await pub.publish(model)
        assert kinds(pub) == {"delta"}

        # b misses a version (hung past its heartbeat: not a member); a goes on by delta; b comes back behind, is
        # brought level (a full catch-up, or a peer), and the next round is full for both, then delta again
        os.killpg(b.proc.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(2.6)  # heartbeat_ttl_s 2
            nudge(model, 102)
            assert await pub.publish(model) == 24
            assert pub.last_report.loaded == [pub.last_report.loaded[0]] and kinds(pub) == {"delta"}
        finally:
            os.killpg(b.proc.pid, signal.SIGCONT)
        for _ in range(300):
            if b.weight_version() == 24:
                break
            await asyncio.sleep(0.1)
        assert b.weight_version() == 24
        await assert_bit_equal(pub, model, [a, b])
        nudge(model, 103)
        await pub.publish(model)
        assert len(pub.last_report.loaded) == 2
        await assert_bit_equal(pub, model, [a, b])
        nudge(model, 104)
        await pub.publish(model)
        assert kinds(pub) == {"delta"} and len(pub.last_report.loaded) == 2
        await assert_bit_equal(pub, model, [a, b])

        # b restarted mid-run: a new replica, which joins from its peer a; the next round is full, then delta
        os.killpg(b.proc.pid, signal.SIGKILL)
        c = replicas(run, wait=False)
        await wait_ready(c)
        assert c.weights_status()["last_update"]["source"] == "peer"
        await asyncio.sleep(2.2)  # b's registry entry expires
        nudge(model, 105)
        await pub.publish(model)
        assert kinds(pub) == {"full"} and len(pub.last_report.loaded) == 2, pub.last_report
        await assert_bit_equal(pub, model, [a, c])
        for step in range(106, 109):
            nudge(model, step)
            await pub.publish(model)
            assert kinds(pub) == {"delta"} and len(pub.last_report.loaded) == 2
        await assert_bit_equal(pub, model, [a, c])


async def test_delta_off_and_full_every_send_whole_rounds(replicas, redis_client, tiny_model_dir):
    run = "delta-off"
    a = replicas(run)
    await wait_registered(redis_client, run, 1)
    model = new_weights(tiny_model_dir)
    async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=64 << 10, full_every=3,
                                                                     **FAST)) as pub:
        seen = []
        for step in range(7):
            nudge(model, step)
            await pub.publish(model)
            seen.append("".join(sorted(kinds(pub))))
        # v1 full; then delta until full_every versions since the last full round
        assert seen == ["full", "delta", "delta", "full", "delta", "delta", "full"], seen
        await assert_bit_equal(pub, model, [a])
    async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=64 << 10, delta="off",
                                                                     **FAST)) as pub:
        for step in range(3):
            nudge(model, 50 + step)
            await pub.publish(model)
            assert kinds(pub) == {"full"}
        await assert_bit_equal(pub, model, [a])
