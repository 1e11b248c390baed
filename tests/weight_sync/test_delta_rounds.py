"""Delta rounds (issue 38) between a publisher in this process and real rollout processes (hf engine, tiny model),
gloo on CPU, a real Redis: each replica's weights (read back through its peer route) are bit-equal to the
learner's wire bytes, and a replica restarted mid-run, joining from a peer, gets a full round and ends level.
The many-round and fault cases run in one process (test_delta_inprocess.py): these cost process starts."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import torch

from services.learner.weights import WeightPublisher
from services.learner.weights import packing as T
from shared.weight_sync import WeightSyncSettings
from tests.weight_sync.conftest import TOKEN, new_weights, wait_ready, wait_registered
from tests.weight_sync.test_publish_hf import FAST

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def nudge(model: torch.nn.Module, step: int, frac: float = 0.02) -> None:
    """A sparse 'optimizer step': ``frac`` of every tensor's elements move a little (the rest keep their bits)."""
    g = torch.Generator().manual_seed(1000 + step)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < frac
            p.add_((mask * torch.randn(p.shape, generator=g) * 1e-3).to(p.device))  # (made on the host: any device)


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


async def test_delta_rounds_across_processes_and_a_joiner_from_a_peer_ends_level(replicas, redis_client,
                                                                                 tiny_model_dir):
    run = "delta"
    a, b = replicas(run), replicas(run)
    await wait_registered(redis_client, run, 2)
    model = new_weights(tiny_model_dir)
    settings = WeightSyncSettings(bucket_bytes=64 << 10, delta="on", **FAST)
    async with WeightPublisher(redis_client, run, settings) as pub:
        assert await pub.publish(model) == 1
        assert kinds(pub) == {"full"} and len(pub.last_report.loaded) == 2
        full_bytes = pub.last_report.round_bytes["full"]
        for step in range(4):
            nudge(model, step)
            await pub.publish(model)
            report = pub.last_report
            assert kinds(pub) == {"delta"} and len(report.loaded) == 2, report
            assert report.round_bytes["delta"] < 0.2 * full_bytes, report.round_bytes
            assert 0.005 < report.changed_fraction < 0.05, report.changed_fraction
        await assert_bit_equal(pub, model, [a, b])
        assert a.weights_status()["last_update"]["phases"].keys() >= {"receive", "patch", "verify", "apply"}

        # b restarted mid-run: its successor joins from its peer a, so the publisher never saw it load the base:
        # the next round is full for both, then delta again, and all end on the learner's bytes
        os.killpg(b.proc.pid, signal.SIGKILL)
        c = replicas(run, wait=False)
        await wait_ready(c)
        assert c.weights_status()["last_update"]["source"] == "peer"
        await asyncio.sleep(2.2)  # b's registry entry expires (heartbeat_ttl_s 2)
        nudge(model, 105)
        await pub.publish(model)
        assert kinds(pub) == {"full"} and len(pub.last_report.loaded) == 2, pub.last_report
        await assert_bit_equal(pub, model, [a, c])
        for step in range(106, 108):
            nudge(model, step)
            await pub.publish(model)
            assert kinds(pub) == {"delta"} and len(pub.last_report.loaded) == 2
        await assert_bit_equal(pub, model, [a, c])


async def test_a_replica_killed_mid_delta_round_is_dropped_and_the_survivor_ends_level(replicas, redis_client,
                                                                                      tiny_model_dir):
    # patches are built while the round runs: the victim dies after bucket 1's patch went out, before bucket 2's
    run = "delta-kill"
    a, b = replicas(run), replicas(run)
    infos = await wait_registered(redis_client, run, 2)
    victim_id = next(i.replica_id for i in infos if i.name.endswith(b.url.rsplit(":", 1)[1]))
    model = new_weights(tiny_model_dir)
    settings = WeightSyncSettings(bucket_bytes=32 << 10, delta="on", **FAST)
    async with WeightPublisher(redis_client, run, settings) as pub:
        await pub.publish(model)
        assert len(pub.outbox.manifest.buckets) >= 3 and len(pub.last_report.loaded) == 2
        build = pub.delta.build

        def build_and_kill(outbox, plan, i):
            if i == 2 and b.proc.poll() is None:
                os.killpg(b.proc.pid, signal.SIGKILL)
                b.proc.wait(10)
            return build(outbox, plan, i)

        pub.delta.build = build_and_kill
        nudge(model, 1)
        await asyncio.wait_for(pub.publish(model), 60)
        report = pub.last_report
        assert report.dropped == [victim_id] and len(report.loaded) == 1, report
        assert kinds(pub) == {"delta"}, report  # the survivor's retry is a delta round too (the plan's patches reused)
        await assert_bit_equal(pub, model, [a])
        await asyncio.sleep(2.2)  # b's registry entry expires (heartbeat_ttl_s 2)
        # a member of that publish never confirmed it: the base stayed, so one full round re-establishes it
        for step, kind in ((2, "full"), (3, "delta")):
            nudge(model, step)
            await pub.publish(model)
            assert kinds(pub) == {kind} and len(pub.last_report.loaded) == 1, pub.last_report
            await assert_bit_equal(pub, model, [a])
