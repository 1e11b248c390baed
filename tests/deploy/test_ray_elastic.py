"""The Ray launcher's elastic rollout pool (issue 30): on a local Ray cluster, rollout actors (hf engine, tiny
model, weight sidecar) started when the learner's demand signal asks for more and drained (POST /drain: the
replica deregisters and exits, the actor is removed, not restarted) when it asks for fewer. The signal is
written to a real Redis here, as the learner writes it."""

from __future__ import annotations

import json
import time

import pytest
import redis

ray = pytest.importorskip("ray", reason="ray is in the `ray` extra: pip install -e '.[ray]' (make test-ray)")

from deploy.ray.launcher import FleetLauncher
from deploy.ray.settings import LaunchSettings
from shared import keys
from tests.deploy.test_ray_launcher import local_ray  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.process]
RUN = "rayelastic"


def test_the_ray_pool_grows_and_drains_on_the_signal(local_ray, tiny_model_dir, redis_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FLEETRL_TOKEN", "ray-elastic-token")
    with pytest.raises(ValueError, match="between rollout_pool.min"):
        LaunchSettings(redis_url=redis_server.url, rollout={"replicas": 3}, rollout_pool={"min": 1, "max": 2})
    s = LaunchSettings(
        run_name=RUN, redis_url=redis_server.url,
        rollout={"replicas": 1, "num_cpus": 1, "health_timeout_s": 120, "config": {
            "model": str(tiny_model_dir), "weight_sidecar": True,
            "engine": {"kind": "hf", "device": "cpu", "torch_threads": 1}}},
        rollout_pool={"min": 1, "max": 2, "cooldown_up_s": 0, "cooldown_down_s": 0, "down_stable_s": 0,
                      "drain_timeout_s": 5})
    r = redis.Redis.from_url(redis_server.url)
    launcher = FleetLauncher(s)
    replicas = f"{keys.weights_prefix(RUN)}:replicas"

    def signal(desired: int) -> None:
        r.set(keys.pool_signal(RUN), json.dumps({"desired_replicas": desired, "at": time.time(), "reason": "test"}))

    def until(what, predicate, timeout=150.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            launcher.tick_pool()
            if predicate():
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}: {launcher.pool_changes}")

    try:
        launcher._start("rollout", s.rollout, 0, launcher._spec("rollout", s.rollout, 0, {}))
        ray.get(launcher.actors["rollout"][0].wait_healthy.remote(120), timeout=180)
        signal(2)
        assert launcher.tick_pool().action == "up"
        assert len(launcher.actors["rollout"]) == 2 and launcher.pool_changes[-1]["replica"] == "rollout-1"
        until("two registered replicas", lambda: r.hlen(replicas) == 2)
        signal(1)
        until("the newest to be drained and removed",
              lambda: len(launcher.actors["rollout"]) == 1 and not launcher.draining)
        assert [c["action"] for c in launcher.pool_changes] == ["start", "drain", "left"]
        assert r.hlen(replicas) == 1, "the drained replica deregistered"
        time.sleep(2)  # its actor is not restarted by Ray
        assert len(launcher.actors["rollout"]) == 1 and ray.get(launcher.actors["rollout"][0].returncode.remote()) is None
    finally:
        launcher.stop()
        r.close()
