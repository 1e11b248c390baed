"""A weight sidecar stops at once: its round loop does not finish a blocking read of the announcements
(``poll_s`` long) before the replica can deregister and its process exit (issue 28: every rollout replica's
shutdown waited up to ``poll_s``, 1 s by default)."""

from __future__ import annotations

import asyncio
import time

from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar
from services.rollout.weights.sinks.base import WeightSink
from shared.weight_sync.registry import ReplicaRegistry


class _Engine:
    kind = "hf"
    weight_version = 0


class _Sink(WeightSink):
    async def run_round(self, rdv, member, manifest, watcher) -> None:  # no round is published here
        raise AssertionError("no round was announced")

    async def load_snapshot(self, manifest) -> None:
        raise AssertionError("no snapshot was published")


async def test_a_stop_does_not_wait_out_the_round_loops_blocking_read(redis_client):
    settings = SidecarSettings(join_timeout_s=0, poll_s=30.0, heartbeat_s=30.0, peer=False)
    engine = _Engine()
    sidecar = WeightSidecar(engine, redis_client, "stop-run", settings, sink=_Sink(engine, settings))
    await sidecar.start()
    registry = ReplicaRegistry(redis_client, "stop-run")
    assert [r.replica_id for r in await registry.alive()] == [sidecar.replica_id]
    await asyncio.sleep(0.3)  # the round loop is blocked in its 30 s read of the announcements now
    t0 = time.monotonic()
    await sidecar.stop()
    took = time.monotonic() - t0
    assert took < 3.0, f"stop took {took:.1f}s: it waited for the round loop's poll_s read"
    assert await registry.alive() == []  # deregistered on the way out
    assert await redis_client.ping()  # the shared client (not the sidecar's) still works
