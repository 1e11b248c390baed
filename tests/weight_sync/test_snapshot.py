"""The fallback transport (safetensors snapshots, shared path or HTTP) gives the same result as the broadcast."""

from __future__ import annotations

import asyncio
import functools
import http.server
import threading

from services.learner.weights import WeightPublisher
from shared.weight_sync import WeightSyncSettings
from tests.weight_sync.conftest import new_weights, reference_ids, wait_ready, wait_registered

FAST = {"init_timeout_s": 20, "collective_timeout_s": 10, "regroup_timeout_s": 5, "load_timeout_s": 20}


async def wait_version(rep, version: int, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while await asyncio.to_thread(rep.weight_version) < version:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{rep.url} did not reach version {version}: {rep.weights_status()}")
        await asyncio.sleep(0.2)


async def test_snapshot_transport_matches_broadcast(replicas, redis_client, tiny_model_dir, tmp_path):
    run = "snap"
    snap_dir = tmp_path / "snapshots"
    snap_dir.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(snap_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    broadcast = replicas(run, wait=False)
    by_path = replicas(run, wait=False, transport="snapshot")
    by_http = replicas(run, transport="snapshot", snapshot_prefer_url="true", snapshot_trusted_urls=f'["{url}"]')
    for rep in (broadcast, by_path):
        await wait_ready(rep)
    await wait_registered(redis_client, run, 3)
    settings = WeightSyncSettings(bucket_bytes=64 << 10, snapshot_dir=str(snap_dir), snapshot_url=url,
                                  snapshot_keep=1, **FAST)
    model = new_weights(tiny_model_dir)
    try:
        async with WeightPublisher(redis_client, run, settings) as pub:
            v = await pub.publish(model)
            assert len(pub.last_report.loaded) == 1  # only the collective replica joins the broadcast
            for rep in (by_path, by_http):
                await wait_version(rep, v)
            outs = [rep.generate() for rep in (broadcast, by_path, by_http)]
            assert {o["meta_info"]["weight_version"] for o in outs} == {str(v)}
            assert outs[0]["output_ids"] == outs[1]["output_ids"] == outs[2]["output_ids"]
            assert outs[0]["output_ids"] == reference_ids(model, tiny_model_dir)
            assert by_http.weights_status()["last_update"]["source"] == "snapshot"
            # versions roll: the next one replaces the old snapshot on disk (snapshot_keep=1)
            v2 = await pub.publish(new_weights(tiny_model_dir, seed=3))
            await wait_version(by_http, v2)
            assert [p.name for p in snap_dir.iterdir()] == [f"v{v2:010d}"]
    finally:
        server.shutdown()
