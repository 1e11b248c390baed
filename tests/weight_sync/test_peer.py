"""Elastic pool (issue 30): a replica that joins a running pool gets the current weights from a PEER replica,
checked against the learner's digests, and the learner runs no catch-up round for it. Real rollout processes
(hf engine, tiny model), a publisher in this process, gloo on CPU, a real Redis."""

from __future__ import annotations

import httpx

from services.learner.weights import WeightPublisher
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync import keys as wkeys
from shared.weight_sync.registry import ReplicaRegistry
from tests.weight_sync.conftest import TOKEN, new_weights, reference_ids, wait_ready, wait_registered
from tests.weight_sync.test_publish_hf import FAST

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_a_joiner_loads_the_current_version_from_a_peer_not_the_learner(replicas, redis_client, tiny_model_dir):
    run = "peer"
    (a,) = replicas.all(run, 1)
    await wait_registered(redis_client, run, 1)
    model = new_weights(tiny_model_dir)
    expected = reference_ids(model, tiny_model_dir)
    # retain none: the publisher keeps no copy of a version, so it could not serve a late joiner at all; a peer can
    settings = WeightSyncSettings(bucket_bytes=64 << 10, retain="none", **FAST)
    async with WeightPublisher(redis_client, run, settings) as pub:
        assert await pub.publish(model) == 1
        sent = pub.last_report.total_bytes
        rounds = int(await redis_client.get(wkeys.round_counter(run)))
        a_info = next(i for i in await ReplicaRegistry(redis_client, run).alive())
        assert a_info.peer_url == a.url and a_info.weight_version == 1

        # the peer route: control token, exact version, bucket in range, raw bytes of the bucket's size
        n_buckets = len(pub.outbox.manifest.buckets)
        assert n_buckets > 1
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as c:
            assert (await c.get("/weights/peer/1/0")).status_code == 401
            assert (await c.get("/weights/peer/2/0", headers=AUTH)).status_code == 409
            r = await c.get(f"/weights/peer/1/{n_buckets}", headers=AUTH)
            assert r.status_code == 404 and "no bucket" in r.text
            assert (await c.get("/weights/peer/0/0", headers=AUTH)).status_code == 400
            r = await c.get("/weights/peer/1/0", headers=AUTH)
            assert r.status_code == 200 and len(r.content) == pub.outbox.manifest.buckets[0].nbytes
        assert all(x is None for x in pub.outbox.buffers)

        joiner = replicas(run, wait=False)
        await wait_ready(joiner)  # healthy only once its sidecar caught up (or gave up)
        status = joiner.weights_status()
        assert status["weight_version"] == 1
        assert status["last_update"]["source"] == "peer" and status["last_update"]["peer"] == a.url, status
        assert status["first_update"] == status["last_update"]
        assert joiner.generate()["output_ids"] == expected
        assert int(await redis_client.get(wkeys.round_counter(run))) == rounds, "the learner ran a catch-up round"
        assert pub.replicas_waiting == []

        # the next version goes to both in the ordinary round, the same bytes per version as before
        model2 = new_weights(tiny_model_dir, seed=2)
        assert await pub.publish(model2) == 2
        assert len(pub.last_report.loaded) == 2 and pub.last_report.total_bytes == sent
        expected2 = reference_ids(model2, tiny_model_dir)
        for rep in (a, joiner):
            assert rep.generate()["output_ids"] == expected2
