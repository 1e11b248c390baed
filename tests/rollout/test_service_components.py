"""The rollout service object starts its components in order (engine, weight sidecar, worker), stops them in
reverse, and unwinds what it started when one fails to start; the app serves the weight routes exactly when
the sidecar is on."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from services.rollout.app import create_app
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings

TOKEN = "t0ken"


class Part:
    def __init__(self, name: str, log: list[str], fail_start: bool = False) -> None:
        self.name, self.log, self.fail_start = name, log, fail_start

    async def start(self) -> None:
        self.log.append(f"start {self.name}")
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")


class Engine(Part):
    kind, queue_depth, inflight, weight_version, paused, context_length = "fake", 0, 0, 3, False, 64
    on_batch_step = None


@pytest.fixture()
def parts(monkeypatch):
    """Stand-ins for the sidecar and worker the service builds; ``fail`` names one that fails to start."""
    log: list[str] = []
    fail: set[str] = set()
    import services.rollout.weights.sidecar as sidecar_module
    import services.rollout.worker.loop as worker_module

    monkeypatch.setattr(sidecar_module, "create_sidecar",
                        lambda engine, settings: Part("sidecar", log, "sidecar" in fail))
    monkeypatch.setattr(worker_module, "RolloutWorker",
                        lambda settings, service, registry: Part("worker", log, "worker" in fail))
    return log, fail


def settings(model_dir, **extra) -> RolloutSettings:
    return RolloutSettings(model=str(model_dir), control_token=TOKEN, **extra)


WORKER = {"enabled": True, "reward_url": "http://127.0.0.1:1"}


async def test_components_start_in_order_and_stop_in_reverse(tiny_model_dir, parts):
    log, _ = parts
    svc = RolloutService(settings(tiny_model_dir, worker=WORKER), engine=Engine("engine", log))
    await svc.start()
    assert log == ["start engine", "start sidecar", "start worker"]
    assert svc.weight_sidecar is not None and svc.worker is not None
    await svc.stop()
    assert log[3:] == ["stop worker", "stop sidecar", "stop engine"]


@pytest.mark.parametrize(("failing", "expected"), [
    ("engine", ["start engine", "stop engine"]),
    ("sidecar", ["start engine", "start sidecar", "stop sidecar", "stop engine"]),
    ("worker", ["start engine", "start sidecar", "start worker", "stop worker", "stop sidecar", "stop engine"]),
])
async def test_a_component_that_fails_to_start_unwinds_the_others(tiny_model_dir, parts, failing, expected):
    log, fail = parts
    fail.add(failing)
    svc = RolloutService(settings(tiny_model_dir, worker=WORKER), engine=Engine("engine", log, failing == "engine"))
    with pytest.raises(RuntimeError, match=f"{failing} cannot start"):
        await svc.start()
    assert log == expected
    await svc.stop()  # nothing left running: stopping again stops nothing
    assert log == expected


async def test_without_the_sidecar_only_engine_and_worker_run(tiny_model_dir, parts):
    log, _ = parts
    svc = RolloutService(settings(tiny_model_dir, worker=WORKER, weight_sidecar=False), engine=Engine("engine", log))
    await svc.start()
    await svc.stop()
    assert log == ["start engine", "start worker", "stop worker", "stop engine"]
    assert svc.weight_sidecar is None


@pytest.mark.parametrize(("extra", "served"), [
    ({}, False),
    ({"weight_sidecar": True}, True),
])
def test_the_weight_routes_are_served_when_the_sidecar_is_on(tiny_model_dir, monkeypatch, extra, served):
    import services.rollout.weights.sidecar as sidecar_module

    monkeypatch.setattr(sidecar_module, "create_sidecar", lambda engine, settings: None)  # as without a redis_url
    s = settings(tiny_model_dir, **extra)
    app = create_app(s, service=RolloutService(s, engine=Engine("engine", [])))
    paths = [p for p in app.openapi()["paths"] if p.startswith("/weights")]
    assert sorted(paths) == (["/weights/peer/{version}/{bucket}", "/weights/update", "/weights/version"] if served else [])
    with TestClient(app) as client:
        r = client.get("/weights/version", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == (503 if served else 404), r.text
        assert r.json()["error"]["code"] == r.status_code
