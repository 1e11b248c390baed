"""One publisher (this process) and real rollout service processes (hf engine, tiny model), gloo on CPU."""

from __future__ import annotations

import asyncio
import time

from services.learner.weights import WeightPublisher
from shared import keys
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync import keys as wkeys
from tests.weight_sync.conftest import new_weights, reference_ids, wait_ready, wait_registered

FAST = {"init_timeout_s": 20, "collective_timeout_s": 10, "regroup_timeout_s": 5, "load_timeout_s": 20,
        "catch_up_poll_s": 0.1}


async def test_publish_reaches_every_replica_and_late_joiner(replicas, redis_client, tiny_model_dir):
    run = "pub"
    a, b = replicas.all(run, 2)
    before = a.generate()["output_ids"]
    assert a.weight_version() == 0
    await wait_registered(redis_client, run, 2)

    model = new_weights(tiny_model_dir)
    expected = reference_ids(model, tiny_model_dir)
    async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=64 << 10, **FAST)) as pub:
        version = await pub.publish(model)
        report = pub.last_report
        assert version == 1 and int(await redis_client.get(keys.weights_version(run))) == 1
        assert len(report.loaded) == 2 and not report.dropped and not report.refused, report
        assert report.rounds == 1

        for rep in (a, b):
            out = rep.generate()
            assert out["meta_info"]["weight_version"] == "1"
            assert out["output_ids"] == expected
            assert rep.weight_version() == 1
        assert expected != before

        # a replica started afterwards is brought to the current version before it serves
        c = replicas(run, wait=False)
        await wait_ready(c)
        assert c.weight_version() == 1
        assert c.generate()["output_ids"] == expected

        # the next version reaches all three (the group is re-formed with the newcomer)
        model2 = new_weights(tiny_model_dir, seed=2)
        t0 = time.monotonic()
        assert await pub.publish(model2) == 2
        assert len(pub.last_report.loaded) == 3, pub.last_report
        expected2 = reference_ids(model2, tiny_model_dir)
        for rep in (a, b, c):
            out = rep.generate()
            assert out["meta_info"]["weight_version"] == "2" and out["output_ids"] == expected2
        # and a third version reuses the group (no re-formation): one round, quick
        assert await pub.publish(model) == 3
        assert pub.last_report.rounds == 1 and len(pub.last_report.loaded) == 3
        assert time.monotonic() - t0 < 60
        # where the time went, by step, on both sides; the reused group formed nothing
        phases = pub.last_report.phases
        assert set(phases) == {"plan", "manifest", "announce", "send", "settle", "finish"}, phases
        assert all(x >= 0 for x in phases.values()) and sum(phases.values()) <= pub.last_report.seconds + 1e-3
        assert set(report.phases) > {"group"}  # the first publish formed the group
        patched = set(pub.last_report.round_bytes) == {"delta"}  # (delta auto: version 3 probes a delta round)
        assert set(a.weights_status()["last_update"]["phases"]) == {"receive", "verify", "apply"} | \
            ({"patch"} if patched else set())
        # every version's manifest is stored (the third was written while its buckets were on the wire)
        for v in (1, 2, 3):
            assert await redis_client.exists(wkeys.manifest(run, v)), v
        status = a.weights_status()
        assert status["weight_version"] == 3 and status["latest_version"] == 3


async def test_weight_routes_need_token_and_validate(replicas, redis_client):
    import httpx

    rep = replicas("routes")
    async with httpx.AsyncClient(base_url=rep.url, timeout=10) as client:
        r = await client.get("/weights/version")
        assert r.status_code == 401
        hdr = {"Authorization": "Bearer weights-test-token"}
        r = await client.post("/weights/update", json={"version": 0}, headers=hdr)
        assert r.status_code in (400, 422)
        r = await client.post("/weights/update", json={}, headers=hdr)
        assert r.status_code == 409 and "no weight version" in r.text


async def test_in_place_publish_serves_late_joiners_only_while_the_weights_hold_the_version(
        replicas, redis_client, tiny_model_dir):
    import torch

    run = "inplace"
    a = replicas(run)
    await wait_registered(redis_client, run, 1)
    model = new_weights(tiny_model_dir)
    async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=64 << 10, **FAST)) as pub:
        assert pub.flatten(model) > 1
        expected = reference_ids(model, tiny_model_dir)  # flattening changes where weights live, not their values
        assert await pub.publish(model.state_dict()) == 1  # the learner publishes its state dict
        assert pub.last_report.loaded == [a.weights_status()["replica_id"]], pub.last_report
        assert all(pub.outbox.in_place) and all(b is None for b in pub.outbox.buffers)  # sent from the weights: no copy
        assert a.generate()["output_ids"] == expected

        # unchanged weights: a late joiner is brought up from them
        c = replicas(run, wait=False)
        await wait_ready(c)
        assert c.weight_version() == 1 and c.generate()["output_ids"] == expected

        # a training step moves the weights on: version 1 can no longer be served from them
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
        assert not pub.outbox.intact()
        assert await pub.publish(model) == 2
        expected2 = reference_ids(model, tiny_model_dir)
        assert expected2 != expected and len(pub.last_report.loaded) == 2
        for rep in (a, c):
            assert rep.generate()["output_ids"] == expected2


async def test_pooled_publish_keeps_no_copy_and_late_joiners_get_the_next_version(
        replicas, redis_client, tiny_model_dir):
    run = "pooled"
    a, b = replicas.all(run, 2)
    await wait_registered(redis_client, run, 2)
    model = new_weights(tiny_model_dir)
    expected = reference_ids(model, tiny_model_dir)
    # retain none: buckets packed into two reused buffers (one on the wire, one being packed), none kept
    settings = WeightSyncSettings(bucket_bytes=64 << 10, retain="none", inflight_buckets=1, **FAST)
    async with WeightPublisher(redis_client, run, settings) as pub:
        assert await pub.publish(model) == 1
        assert len(pub.last_report.loaded) == 2 and not pub.last_report.refused, pub.last_report
        assert len(pub.outbox.manifest.buckets) > 2 and all(x is None for x in pub.outbox.buffers)
        for rep in (a, b):
            out = rep.generate()
            assert out["output_ids"] == expected and out["meta_info"]["weight_version"] == "1"

        # nothing was kept of version 1: a replica that joins now (and does not ask its peers, which would serve
        # it version 1: tests/weight_sync/test_peer.py) serves what it has, then gets version 2
        c = replicas(run, wait=False, join_timeout_s="1", peer="false")
        await wait_ready(c)
        assert c.weight_version() == 0
        c_id = c.weights_status()["replica_id"]
        deadline = time.monotonic() + 20  # the publisher says who waits (a learner then publishes sooner)
        while pub.replicas_waiting != [c_id]:
            assert time.monotonic() < deadline, pub.replicas_waiting
            await asyncio.sleep(0.1)
        model2 = new_weights(tiny_model_dir, seed=3)
        assert await pub.publish(model2) == 2
        assert len(pub.last_report.loaded) == 3, pub.last_report
        expected2 = reference_ids(model2, tiny_model_dir)
        for rep in (a, b, c):
            assert rep.generate()["output_ids"] == expected2
        assert pub.replicas_waiting == []
