"""The elastic pool controller on real processes (deploy/run/autoscale.py): real rollout services (hf engine, tiny
model, weight sidecar), a real Redis holding the demand signal. It starts a planned replica when the signal asks
for more, drains the newest (POST /drain: it deregisters and exits) when it asks for fewer, restarts one that
died, and says each change with its reason."""

from __future__ import annotations

import json
import time

import pytest

from deploy.local.fleet import Fleet
from deploy.run.autoscale import Autoscaler
from deploy.run.plan import ProcessPlan
from deploy.run.spec import RolloutPoolSpec
from shared import keys
from shared.ports import free_port

pytestmark = pytest.mark.process

TOKEN = "autoscale-token"
RUN = "autoscale"


def until(what, predicate, scaler, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        scaler.tick()
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; changes: {scaler.changes}")


def test_the_controller_grows_drains_and_replaces(tmp_path, redis_server, tiny_model_dir):
    import redis

    r = redis.Redis.from_url(redis_server.url)
    r.delete(keys.pool_signal(RUN))

    def signal(desired: int) -> None:
        r.set(keys.pool_signal(RUN), json.dumps({"desired_replicas": desired, "at": time.time(), "reason": "test"}))

    plans = [ProcessPlan(f"rollout-{i}", "rollout", {
        "model": str(tiny_model_dir), "port": free_port(), "redis_url": redis_server.url, "run_name": RUN,
        "control_token": TOKEN, "weight_sidecar": True,
        "engine": {"kind": "hf", "device": "cpu", "torch_threads": 1}}) for i in range(2)]
    pool = RolloutPoolSpec(min=1, max=2, cooldown_up_s=0, cooldown_down_s=0, down_stable_s=0, drain_timeout_s=5)
    said: list[str] = []
    with Fleet(run_dir=tmp_path, redis_url=redis_server.url) as fleet:
        fleet.start("rollout-0", "services.rollout", plans[0].config)
        scaler = Autoscaler(pool, plans, fleet, redis_server.url, RUN, TOKEN, said.append)
        try:
            d = scaler.tick()
            assert d.action == "hold" and "no demand signal" in d.reason and "rollout-1" not in fleet.services
            signal(2)
            until("rollout-1 to join", lambda: any(c["action"] == "joined" for c in scaler.changes), scaler)
            assert [c["action"] for c in scaler.changes] == ["start", "joined"]
            assert scaler.changes[0]["replica"] == "rollout-1" and "asks for 2" in scaler.changes[0]["reason"]
            assert r.hlen(f"{keys.weights_prefix(RUN)}:replicas") == 2

            signal(1)
            until("rollout-1 to leave", lambda: any(c["action"] == "left" for c in scaler.changes), scaler)
            assert [c["action"] for c in scaler.changes][2:] == ["drain", "left"]
            assert "rollout-1" not in fleet.services and fleet.services["rollout-0"].alive
            assert r.hlen(f"{keys.weights_prefix(RUN)}:replicas") == 1, "the drained replica deregistered"

            fleet.signal("rollout-0", 9)  # SIGKILL: it died, nobody drained it
            until("rollout-0 to be replaced", lambda: any(c["action"] == "replace" for c in scaler.changes)
                  and "rollout-0" not in scaler.starting, scaler)
            assert fleet.services["rollout-0"].alive
            replace = next(c for c in scaler.changes if c["action"] == "replace")
            assert "rollout-0 (exit code -9) died" in replace["reason"]
            assert all(line.startswith("pool: ") for line in said) and len(said) == len(scaler.changes)
        finally:
            scaler.close()


def test_a_replica_that_keeps_dying_is_replaced_max_replacements_times_then_left_out(tmp_path, redis_server):
    """A replica that cannot start (a model directory that does not exist) would be restarted forever: the
    controller restarts it max_replacements times, then stops, leaves it out, and says why."""
    plans = [ProcessPlan("rollout-0", "rollout", {"model": str(tmp_path / "no-such-model"), "port": free_port(),
                                                  "redis_url": redis_server.url, "run_name": "crashloop",
                                                  "engine": {"kind": "hf", "device": "cpu"}})]
    pool = RolloutPoolSpec(min=1, max=1, max_replacements=2)
    said: list[str] = []
    with Fleet(run_dir=tmp_path, redis_url=redis_server.url) as fleet:
        fleet.start("rollout-0", "services.rollout", plans[0].config, wait=False)
        scaler = Autoscaler(pool, plans, fleet, redis_server.url, "crashloop", TOKEN, said.append)
        try:
            until("the controller to give up", lambda: "rollout-0" in scaler.given_up, scaler, timeout=180)
            assert [c["action"] for c in scaler.changes] == ["replace", "replace", "give up"]
            assert "died 3 times (max_replacements 2)" in scaler.changes[-1]["reason"]
            assert "rollout-0" not in fleet.services
            for _ in range(3):  # nothing is started again, however the pool asks
                scaler.tick()
            assert "rollout-0" not in fleet.services and len(scaler.changes) == 3
        finally:
            scaler.close()
