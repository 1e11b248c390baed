"""The Ray launcher on a local CPU Ray cluster: reward, rollout and learner as actors running the real
services; a rollout actor is killed mid-training, Ray restarts it, and training finishes with every
version delivered to the restarted replica."""

from __future__ import annotations

import json
import time

import httpx
import pytest

ray = pytest.importorskip("ray", reason="ray is in the `ray` extra: pip install -e '.[ray]' (make test-ray)")

from deploy.local.sort_task import make_splits, write_jsonl
from deploy.ray.launcher import REPO, FleetLauncher
from deploy.ray.settings import LaunchSettings
from tests.procs import starts_processes

pytestmark = [pytest.mark.slow, pytest.mark.process]  # a local Ray cluster and the fleet on it (~1-2 min)

# Long enough that the kill lands mid-run: steps of this tiny model take ~50 ms while the rollout replica
# is up, and the learner cannot run more than ~2 steps ahead of it (window 8, staleness 1) while it is down.
STEPS = 40


@pytest.fixture()
@starts_processes
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=100 * 1024 * 1024, namespace="fleetrl-test",
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}},
             log_to_driver=False)
    yield
    ray.shutdown()


def launch_settings(tmp_path, model_dir, redis_url) -> LaunchSettings:
    train, _ = make_splits(0, 20)
    data = write_jsonl(train[:400], tmp_path / "train.jsonl")
    sampling = {"max_new_tokens": 6, "temperature": 1.0}
    return LaunchSettings(
        run_name="raytest", redis_url=redis_url,
        reward={"replicas": 1, "num_cpus": 0.5, "config": {
            "scorers": [{"name": "exact", "kind": "rule", "weight": 1.0, "check": {"type": "exact"}}]}},
        rollout={"replicas": 1, "num_cpus": 1, "health_timeout_s": 120, "config": {
            "model": str(model_dir), "engine": {"kind": "hf", "device": "cpu", "torch_threads": 1},
            "worker": {"enabled": True, "concurrency": 8, "sampling": sampling},
            "run": {"max_staleness": 1, "prompt_claim_idle_ms": 1500},
            "weights": {"join_timeout_s": 20}}},
        learner={"replicas": 1, "num_cpus": 1, "health_timeout_s": 120, "config": {
            "run_dir": str(tmp_path / "learner"), "model": {"actor": str(model_dir)},
            "algorithm": {"name": "grpo"}, "optim": {"actor_lr": 1e-4, "schedule": "constant", "warmup_ratio": 0.0},
            "train": {"groups_per_step": 4, "micro_batch_size": 16, "max_steps": STEPS, "torch_threads": 1},
            "rollout": {"group_size": 4, "window": 8, "prompt_timeout_s": 15, "sampling": sampling},
            "run": {"max_staleness": 1, "prompt_claim_idle_ms": 1500},  # the same at every service of the run
            "data": {"path": str(data), "input_key": "input", "label_key": "label", "epochs": 5},
            "publish": {"every": 1, "sync": {"init_timeout_s": 10, "collective_timeout_s": 10,
                                             "regroup_timeout_s": 3, "load_timeout_s": 20}},
            "checkpoint": {"every": 100},
            "observability": {"progress_bar": False, "plot": False}}},
    )


def learner_step(url: str) -> int:
    try:
        return int(httpx.get(f"{url}/status", timeout=5).json().get("step") or 0)
    except httpx.HTTPError:
        return -1


def wait_for(what: str, fn, timeout: float, launcher: FleetLauncher):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {json.dumps(launcher.info(), indent=1)}")


@pytest.mark.timeout(480)  # ~1-2 min quiet; starting Ray alone takes 30 s on a loaded 2-core machine
def test_fleet_on_ray_survives_a_killed_rollout_actor(tmp_path, tiny_model_dir, redis_server, local_ray,
                                                       monkeypatch):
    monkeypatch.setenv("FLEETRL_TOKEN", "ray-test-token")
    launcher = FleetLauncher(launch_settings(tmp_path, tiny_model_dir, redis_server.url))
    try:
        urls = launcher.start()
        learner_url = urls["learner"][0]
        assert httpx.get(f"{urls['reward'][0]}/health", timeout=5).status_code == 200
        item = {"prompt": "p", "response": "1", "label": "1"}  # scoring needs the run's token (the workers send it)
        assert httpx.post(f"{urls['reward'][0]}/score", json={"items": [item]}, timeout=10).status_code == 401

        wait_for("learner step >= 2", lambda: learner_step(learner_url) >= 2, 90, launcher)
        before = ray.get(launcher.actors["rollout"][0].info.remote())
        ray.kill(launcher.actors["rollout"][0], no_restart=False)  # Ray restarts it (max_restarts=-1)

        def restarted():
            try:
                info = ray.get(launcher.actors["rollout"][0].info.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return None
            return info if info["restarted"] and info["pid"] != before["pid"] else None

        after = wait_for("the rollout actor to come back", restarted, 60, launcher)
        assert after["actor_pid"] != before["actor_pid"]
        ray.get(launcher.actors["rollout"][0].wait_healthy.remote(90))
        step_at_restart = learner_step(learner_url)

        code = launcher.wait(timeout_s=150)
        assert code == 0, ray.get(launcher.actors["learner"][0].log_tail.remote())
        rows = [json.loads(x) for x in (tmp_path / "learner" / "metrics.jsonl").read_text().splitlines()]
        assert max(r["step"] for r in rows) == STEPS
        assert step_at_restart < STEPS, "training went on after the restart"
        info = httpx.get(f"{after['url']}/model_info", timeout=10).json()
        assert info["weight_version"] == str(STEPS), "the restarted replica serves the learner's last version"
    finally:
        launcher.stop()
