"""fleetrl run places the learner and each replica on a device and derives how weights travel between them;
a placement that cannot work is refused at start in one line (pure: no GPU needed)."""

from __future__ import annotations

import pytest

from deploy.run.placement import PlacementSpec, place
from shared.settings import SettingsError


def run(gpus: int, replicas: int = 1, spec: PlacementSpec | None = None, learner: dict | None = None,
        rollout: dict | None = None) -> tuple[dict, list[dict], list[str]]:
    learner = learner or {}
    rollouts = [dict(rollout or {}) for _ in range(replicas)]
    lines = place(learner, rollouts, spec or PlacementSpec(), gpus)
    return learner, rollouts, lines


def test_cpu_host_keeps_everything_on_the_cpu_over_gloo():
    learner, (r,), lines = run(gpus=0)
    assert learner["model"]["device"] == "cpu" and r["engine"]["device"] == "cpu"
    assert r["weights"] == {"transport": "collective", "backend": "gloo"}
    assert learner["publish"]["sync"]["backend"] == "gloo"
    assert lines == ["rollout-0 on cpu, learner on cpu: weights by collective (gloo)"]


def test_one_gpu_defaults_colocate_over_ipc_with_a_memory_budget():
    learner, rollouts, lines = run(gpus=1, replicas=2)
    assert learner["model"]["device"] == "cuda:0"
    for r in rollouts:
        assert r["engine"]["device"] == "cuda:0" and r["weights"] == {"transport": "ipc"}
        assert r["engine"]["gpu_memory_fraction"] == pytest.approx(0.175)  # 0.35 shared by two engines
    assert "sync" not in learner["publish"] or "backend" not in learner["publish"]["sync"]
    assert lines[0] == "rollout-0 on cuda:0, learner on cuda:0: weights by ipc"


def test_several_gpus_put_replicas_on_the_others_over_nccl():
    learner, rollouts, _ = run(gpus=4, replicas=4)
    assert [r["engine"]["device"] for r in rollouts] == ["cuda:1", "cuda:2", "cuda:3", "cuda:1"]
    assert all(r["weights"] == {"transport": "collective", "backend": "nccl"} for r in rollouts)
    assert learner["publish"]["sync"]["backend"] == "nccl"
    assert all("gpu_memory_fraction" not in r["engine"] for r in rollouts)


def test_the_issue_placement_engine_on_cuda_with_learner_auto_works():
    # `--set services.rollout.engine.device=cuda` on one GPU: it used to pick gloo and fail every round
    learner, (r,), _ = run(gpus=1, rollout={"engine": {"device": "cuda"}})
    assert r["weights"] == {"transport": "ipc"} and learner["model"]["device"] == "cuda:0"


def test_cpu_replica_of_a_gpu_learner_goes_over_gloo():
    learner, (r,), _ = run(gpus=1, spec=PlacementSpec(rollout="cpu"))
    assert r["weights"] == {"transport": "collective", "backend": "gloo"}
    assert learner["publish"]["sync"]["backend"] == "gloo"


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"gpus": 1, "rollout": {"engine": {"device": "cuda"}, "weights": {"backend": "nccl"}}},
     "nccl cannot pair two ranks on one GPU"),
    ({"gpus": 2, "spec": PlacementSpec(rollout=["cuda:1", "cpu"]), "replicas": 2}, "learner publishes over one backend"),
    ({"gpus": 1, "spec": PlacementSpec(learner="cuda:3")}, "this host shows 1 GPU"),
    ({"gpus": 2, "rollout": {"weights": {"transport": "ipc"}}}, "must be on the learner's GPU"),
])
def test_placements_that_cannot_work_are_refused_in_one_line(kwargs, says):
    with pytest.raises(SettingsError, match=says) as err:
        run(**kwargs)
    assert str(err.value).startswith("placement: ") and "\n" not in str(err.value)


def test_remote_engines_keep_their_own_sidecar_settings():
    _, (r,), lines = run(gpus=1, rollout={"engine": {"kind": "vllm", "base_url": "http://x"}})
    assert "weights" not in r and lines == []
