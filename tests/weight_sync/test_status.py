"""``fleetrl weights status``: what an operator sees of a run's weight sync (real Redis, the CLI as a process)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from services.rollout.weights.receiver import RoundWatcher
from shared import keys
from shared.ports import free_port
from shared.weight_sync import keys as wkeys
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.status import weight_sync_status
from shared.weight_sync.wire import Member, Rendezvous, ReplicaInfo
from tests.procs import REPO

pytestmark = pytest.mark.process  # runs `fleetrl weights status` as a process


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy.cli", "weights", "status", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


async def test_status_shows_versions_dead_replicas_and_the_last_rounds_reports(redis_client, redis_server):
    run = "status"
    registry = ReplicaRegistry(redis_client, run)
    await registry.put(ReplicaInfo(replica_id="a", name="host-a:8000", transport="collective", engine="hf",
                                   weight_version=2), ttl_s=30)
    await registry.put(ReplicaInfo(replica_id="b", name="host-b:8000", transport="collective", engine="sglang",
                                   weight_version=1), ttl_s=0.2)
    await asyncio.sleep(0.4)  # b's heartbeat lapsed: it died without deregistering
    await redis_client.set(keys.weights_version(run), "3")
    rdv = Rendezvous(round=7, version=3, manifest_key="m", group_name="g", fresh_group=True, backend="gloo",
                     master_addr="127.0.0.1", master_port=1, world_size=3,
                     members=(Member(replica_id="a", rank=1), Member(replica_id="b", rank=2)),
                     init_timeout_s=1, collective_timeout_s=1, load_timeout_s=1)
    await redis_client.set(wkeys.rendezvous(run), rdv.dumps())
    await RoundWatcher(redis_client, run, "a").report(rdv, "refused", "bucket(s) [0] failed the checksum")
    choice = {"version": 3, "kind": "full", "reason": "faster", "full_s": 0.3, "delta_s": 0.45}
    await redis_client.set(wkeys.delta_choice(run), json.dumps(choice))  # as the publisher writes it

    status = await weight_sync_status(redis_client, run)
    assert status["latest_version"] == 3
    by_id = {r["replica_id"]: r for r in status["replicas"]}
    assert by_id["a"]["alive"] and by_id["a"]["behind"] == 1 and by_id["a"]["engine"] == "hf"
    assert not by_id["b"]["alive"] and by_id["b"]["behind"] == 2  # shown, not pruned
    assert await redis_client.hlen(wkeys.replicas(run)) == 2
    last = status["last_round"]
    assert last["round"] == 7 and last["version"] == 3
    assert [(m["replica_id"], m["report"]) for m in last["members"]] == [("a", "refused"), ("b", None)]
    assert "checksum" in last["members"][0]["detail"]
    assert status["delta_choice"] == choice

    out = await asyncio.to_thread(cli, "--redis-url", redis_server.url, "--run-name", run)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(json.dumps(status))

    empty = await weight_sync_status(redis_client, "nothing-here")
    assert empty == {"run": "nothing-here", "latest_version": 0, "replicas": [], "last_round": None,
                     "delta_choice": None}


def test_status_of_an_unreachable_redis_is_a_one_line_error():
    out = cli("--redis-url", f"redis://127.0.0.1:{free_port()}", "--run-name", "x")
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot read from Redis at") and "Traceback" not in out.stderr
