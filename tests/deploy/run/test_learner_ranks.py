"""``replicas.learner: N``: fleetrl run's placement of N learner ranks (one GPU each, refused in one line where it
cannot work), and the rendered runs carry the ranks with their rendezvous (Ray placement group, k8s Indexed Job
with a headless Service, compose followers) rather than a hand-written torchrun line. Pure: no process starts."""

from __future__ import annotations

import shutil

import pytest
import yaml

from deploy.ray.settings import LaunchSettings
from deploy.run.learner_ranks import follower_name, rank_envs
from deploy.run.load import load_spec
from deploy.run.placement import PlacementSpec, place
from deploy.run.render import render
from shared.settings import SettingsError
from tests.deploy.run.conftest import tiny_spec


def test_cpu_ranks_use_gloo_and_gpu_ranks_take_one_gpu_each():
    learner: dict = {}
    place(learner, [{}], PlacementSpec(), gpus=0, ranks=4)
    assert learner["model"]["device"] == "cpu"
    learner, rollouts = {}, [{}, {}]
    lines = place(learner, rollouts, PlacementSpec(), gpus=4, ranks=2)
    assert learner["model"]["device"] == "cuda"  # rank i resolves it to cuda:<LOCAL_RANK i>
    assert [r["engine"]["device"] for r in rollouts] == ["cuda:2", "cuda:3"]  # the GPUs the ranks leave
    assert lines[0] == "rollout-0 on cuda:2, learner on cuda:0: weights by collective (nccl)"
    learner, (r,) = {}, [{}]
    place(learner, [r], PlacementSpec(), gpus=2, ranks=2)  # no GPU left: the replica shares rank 0's
    assert r["engine"]["device"] == "cuda:0" and r["weights"] == {"transport": "ipc"}


@pytest.mark.parametrize(("gpus", "ranks", "learner", "says"), [
    (2, 4, {}, "replicas.learner: 4 ranks take one GPU each, but this host shows 2 GPU(s)"),
    (4, 2, {"model": {"device": "cuda:1"}}, "its device cannot be cuda:1: set it to cuda"),
])
def test_a_placement_that_cannot_work_is_refused_in_one_line(gpus, ranks, learner, says):
    with pytest.raises(SettingsError) as err:
        place(learner, [{}], PlacementSpec(), gpus=gpus, ranks=ranks)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_rank_environments_meet_at_rank_0():
    assert rank_envs(1) == [{}]
    envs = rank_envs(3, master_port=29999)
    assert [e["RANK"] for e in envs] == ["0", "1", "2"] and {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", "29999")}
    assert follower_name(2) == "learner-rank-2"


def test_an_sft_spec_with_several_learner_ranks_is_refused(tmp_path, tiny_model_dir):
    path = tiny_spec(tmp_path, tiny_model_dir, algorithm={"name": "sft"}, reward=None, eval={}, train={},
                     replicas={"learner": 2})
    with pytest.raises(Exception) as err:
        load_spec(path)
    assert "replicas.learner: 2 ranks; algorithm sft trains on one rank" in str(err.value)


@pytest.fixture()
def spec_dir(tmp_path, tiny_model_dir):
    shutil.copytree(tiny_model_dir, tmp_path / "sft-model")
    tiny_spec(tmp_path, tmp_path / "sft-model", replicas={"rollout": 2, "learner": 4})
    return tmp_path


def _render(target, spec_dir, **kw):
    spec_file = spec_dir / "run.yaml"
    return render(target, load_spec(spec_file), spec_file, spec_dir / "out" / target, **kw)


def test_ray_places_the_ranks_in_the_launchers_placement_group(spec_dir, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    _, (path,) = _render("ray", spec_dir)
    launch = LaunchSettings.from_file(path)
    assert launch.learner.replicas == 4  # bundle i = rank i; the launcher sets RANK / MASTER_ADDR for each


def test_k8s_is_an_indexed_job_that_meets_at_rank_0_through_a_headless_service(spec_dir):
    carried, _ = _render("k8s", spec_dir)
    docs = [d for d in yaml.safe_load_all((spec_dir / "out" / "k8s" / "learner.yaml").read_text()) if d]
    job, http, headless = docs
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4
    assert job["spec"]["parallelism"] == 4
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"].endswith("job-completion-index']")
    assert env["WORLD_SIZE"]["value"] == "4"
    assert env["MASTER_ADDR"]["value"] == f"fleetrl-learner-0.{pod['subdomain']}"
    assert headless["spec"]["clusterIP"] == "None" and headless["metadata"]["name"] == pod["subdomain"]
    assert http["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"  # HTTP: rank 0 only
    probe = pod["containers"][0]["readinessProbe"]["exec"]["command"][-1]
    assert '[ "$RANK" != 0 ]' in probe and "/health" in probe  # ranks > 0 serve no HTTP
    assert any("ReadWriteMany" in n for n in carried.notes)
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_compose_adds_followers_that_dial_the_learner_service(spec_dir):
    _render("compose", spec_dir)
    services = yaml.safe_load((spec_dir / "out" / "compose" / "docker-compose.yml").read_text())["services"]
    assert services["learner"]["environment"]["RANK"] == "0"
    for r in (1, 2, 3):
        f = services[f"learner-rank-{r}"]
        assert f["environment"]["RANK"] == str(r) and f["environment"]["MASTER_ADDR"] == "learner"
        assert f["environment"]["WORLD_SIZE"] == "4" and "healthcheck" not in f and "ports" not in f
    assert "learner-rank-4" not in services
