"""A service that does its whole job between two health polls (a learner with 2 steps trains, checkpoints and
exits with 0 in under a second) has not failed to start: the local fleet and the Ray actor both return from their
health wait and leave the exit code to the caller. A service that exits with an error still fails the wait, with
its log. (CI failed ``fleetrl run --on ray`` on this: "learner-0 exited with 0".)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deploy.local.fleet import Fleet, FleetError

pytestmark = pytest.mark.process

PROBE = "tests.deploy.zygote_probe"
REPO = Path(__file__).resolve().parents[2]


def test_the_local_fleet_takes_an_exit_with_0_while_starting_as_done(tmp_path):
    with Fleet(run_dir=tmp_path / "run") as fleet:
        svc = fleet.start("learner-0", PROBE, {"report": str(tmp_path / "r.json"), "exit": 0}, timeout=60)
        assert svc.proc.wait(timeout=30) == 0
        with pytest.raises(FleetError, match=r"(?s)failing-0 exited with code 3 while starting:.*probe says hello"):
            fleet.start("failing-0", PROBE, {"report": str(tmp_path / "f.json"), "exit": 3}, timeout=60)


def test_the_ray_actor_takes_an_exit_with_0_while_starting_as_done(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray", reason="ray is in the `ray` extra: pip install -e '.[ray]' (make test-ray)")
    from deploy.ray import service_actor

    class Context:
        was_current_actor_reconstructed = False

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    monkeypatch.setattr(service_actor.os, "_exit", lambda code: None)  # the watcher ends the actor on an error

    def actor(name: str, code: int) -> service_actor.ServiceProcessActor:
        spec = {"name": name, "module": PROBE, "port": 0, "workdir": str(REPO),
                "settings": {"report": str(tmp_path / f"{name}.json"), "exit": code}}
        a = service_actor.ServiceProcessActor(spec)
        deadline = time.monotonic() + 30
        while a.returncode() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return a

    done = actor("learner-0", 0)
    assert done.wait_healthy(30) == done.url() and done.returncode() == 0
    failed = actor("failing-0", 3)
    with pytest.raises(RuntimeError, match=r"(?s)failing-0 exited with 3:.*probe says hello"):
        failed.wait_healthy(30)

