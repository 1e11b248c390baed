"""``fleetrl render k8s|compose|ray``: the run spec carried to a cluster. The manifests validate against the
Kubernetes schemas (as deploy/k8s/'s own do), every rendered form carries the spec's model, reward, algorithm and
replicas, paths move onto the cluster's volumes, and no secret is ever written in clear."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from deploy.ray.settings import LaunchSettings
from deploy.run.load import load_spec
from deploy.run.render import RenderError, carry, render
from tests.deploy.run.conftest import tiny_spec
from tests.procs import REPO

K8S_VERSION = "1.30.0"
PASSWORD = "s3cret-redis-pw-do-not-write"


@pytest.fixture()
def spec_dir(tmp_path, tiny_model_dir):
    """A spec beside its model (``model: sft-model``), data and a reward module, as a user's directory is."""
    shutil.copytree(tiny_model_dir, tmp_path / "sft-model")
    (tmp_path / "my_reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                          "    return float(solution_str.strip() == ground_truth)\n")
    tiny_spec(tmp_path, tmp_path / "sft-model", export="final-model",
              reward={"scorers": [{"name": "mine", "kind": "python", "function": "my_reward:compute_score",
                                   "signature": "verl"}]},
              algorithm={"name": "rloo"}, optim={"actor_lr": 2.5e-4, "schedule": "constant", "warmup_ratio": 0.0},
              replicas={"rollout": 3, "reward": 2})
    return tmp_path


def configs_of(manifests: dict) -> dict:
    cm = next(d for d in manifests["config.yaml"] if d["kind"] == "ConfigMap")
    return {k.removesuffix(".yaml"): yaml.safe_load(v) for k, v in cm["data"].items()}


def rendered(target, spec_dir, **kw):
    spec_file = spec_dir / "run.yaml"
    out = spec_dir / "out" / target
    carried, written = render(target, load_spec(spec_file), spec_file, out, **kw)
    return carried, written, out


def test_k8s_manifests_validate_and_carry_the_spec(spec_dir):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    _, written, out = rendered("k8s", spec_dir)
    manifests = {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in written
                 if p.name != "kustomization.yaml"}
    for docs in manifests.values():
        for doc in docs:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kust = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(manifests)
    cfg = configs_of(manifests)
    learner, rollout, reward = cfg["learner"], cfg["rollout"], cfg["reward"]
    assert learner["model"]["actor"] == rollout["model"] == "/models/sft-model"  # the spec's directory is /models
    assert learner["data"]["path"] == "/models/train.jsonl"
    assert learner["algorithm"]["name"] == "rloo" and learner["optim"]["actor_lr"] == 2.5e-4
    assert learner["train"]["max_steps"] == 2 and learner["rollout"]["group_size"] == 2
    assert learner["checkpoint"]["export_dir"] == "/checkpoints/final-model"
    assert learner["run_dir"] == "/checkpoints/learner" and learner["run_name"] == rollout["run_name"] == "tiny"
    assert rollout["worker"]["reward_url"] == "http://fleetrl-reward:8002"
    (scorer,) = reward["scorers"]
    assert scorer["function"] == "my_reward:compute_score" and scorer["sys_path"] == ["/models"]
    deployments = {d["metadata"]["name"]: d for docs in manifests.values() for d in docs if d["kind"] == "Deployment"}
    assert deployments["fleetrl-rollout"]["spec"]["replicas"] == 3 and deployments["fleetrl-reward"]["spec"]["replicas"] == 2
    reward_pod = deployments["fleetrl-reward"]["spec"]["template"]["spec"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in reward_pod["containers"][0]["volumeMounts"]
    rollout_env = {e["name"]: e for e in deployments["fleetrl-rollout"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert rollout_env["FLEETRL_WAIT_FOR"]["value"].endswith("file:/models/sft-model/config.json")
    assert rollout_env["FLEETRL_ROLLOUT_CONTROL_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "fleetrl-token"
    assert "prepare-job.yaml" not in manifests  # the demo's own preparation is not the user's run


def test_compose_file_carries_the_spec_with_secrets_from_the_environment(spec_dir):
    _, _written, out = rendered("compose", spec_dir)
    compose = yaml.safe_load((out / "docker-compose.yml").read_text())
    svc = compose["services"]
    assert set(svc) == {"redis", "reward", "rollout", "learner"}
    assert svc["rollout"]["deploy"]["replicas"] == 3 and svc["reward"]["deploy"]["replicas"] == 2
    assert f"{spec_dir}:/models:ro" in svc["learner"]["volumes"]
    for name in ("reward", "rollout", "learner"):
        cfg = yaml.safe_load((out / "config" / f"{name}.yaml").read_text())
        assert f"./config/{name}.yaml:/config/{name}.yaml:ro" in svc[name]["volumes"]
        if name == "learner":
            assert cfg["model"]["actor"] == "/models/sft-model" and cfg["algorithm"]["name"] == "rloo"
            assert cfg["publish"]["sync"]["master_addr"] == "learner"
        if name == "rollout":
            assert cfg["worker"]["reward_url"] == "http://reward:8002"
    for name in ("reward", "rollout", "learner"):
        for key, value in svc[name]["environment"].items():
            if key.endswith(("TOKEN", "RUN_KEY")):
                assert value.startswith("${") and value.endswith("}"), (name, key)


def test_ray_launch_settings_carry_the_spec_and_read_the_redis_url_from_the_environment(spec_dir, monkeypatch):
    (spec_dir / "run.yaml").write_text((spec_dir / "run.yaml").read_text().replace(
        "rollout: 3", "rollout: {min: 1, max: 3}"))
    _, (path,), _ = rendered("ray", spec_dir, redis_url=f"redis://:{PASSWORD}@10.0.0.5:6379/0")
    assert PASSWORD not in path.read_text() and "${REDIS_URL}" in path.read_text()
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ValueError, match="REDIS_URL"):
        LaunchSettings.from_file(path)
    monkeypatch.setenv("REDIS_URL", f"redis://:{PASSWORD}@10.0.0.5:6379/0")
    s = LaunchSettings.from_file(path)
    assert s.redis_url.endswith("@10.0.0.5:6379/0") and s.run_name == "tiny"
    assert s.rollout.replicas == 1 and s.rollout_pool is not None and s.rollout_pool.max == 3
    assert s.reward.replicas == 2 and s.reward.config["scorers"][0]["sys_path"] == [str(spec_dir)]
    assert s.rollout.config["worker"]["enabled"] is True  # the worker takes prompts, as under fleetrl run
    assert s.learner.config["algorithm"]["name"] == "rloo" and s.learner.config["model"]["actor"] == str(
        spec_dir / "sft-model")


@pytest.mark.parametrize("target", ["k8s", "compose", "ray"])
def test_a_secret_in_the_spec_is_refused_never_written(spec_dir, target):
    spec_file = spec_dir / "run.yaml"
    raw = yaml.safe_load(spec_file.read_text())
    raw["reward"] = {"scorers": [{"name": "rm", "kind": "http", "url": "http://rm:9000/score", "protocol": "openrlhf",
                                  "api_key": PASSWORD}]}
    spec_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(RenderError, match=r"reward\.scorers\[0\]\.api_key: a secret would be written"):
        render(target, load_spec(spec_file), spec_file, spec_dir / "out")
    assert not (spec_dir / "out").exists() or PASSWORD not in "".join(
        p.read_text() for p in (spec_dir / "out").rglob("*") if p.is_file())


def test_a_redis_url_with_a_password_is_not_written(spec_dir):
    spec_file = spec_dir / "run.yaml"
    raw = yaml.safe_load(spec_file.read_text())
    raw["redis"] = {"url": f"redis://:{PASSWORD}@redis.internal:6379/0"}
    spec_file.write_text(yaml.safe_dump(raw))
    for target in ("k8s", "compose", "ray"):
        _, written, _ = rendered(target, spec_dir)
        assert all(PASSWORD not in p.read_text() for p in written), target


def test_an_sft_spec_is_refused_with_what_to_do(tmp_path, tiny_model_dir):
    spec_file = tmp_path / "sft.yaml"
    (tmp_path / "d.jsonl").write_text('{"input": "a", "output": "b"}\n')
    spec_file.write_text(yaml.safe_dump({"run_name": "s", "model": str(tiny_model_dir), "algorithm": {"name": "sft"},
                                         "data": {"path": "d.jsonl"}}))
    with pytest.raises(RenderError, match="an sft run is the learner alone"):
        carry(load_spec(spec_file), spec_file, target="k8s")


@pytest.mark.process
def test_fleetrl_render_command_writes_the_files(spec_dir):
    out = spec_dir / "k8s-out"
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "render", "k8s", str(spec_dir / "run.yaml"), "-o",
                           str(out), "--set", "train.max_steps=7"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out / 'kustomization.yaml'}" in done.stdout and "note: eval is not carried" in done.stdout
    cm = yaml.safe_load((out / "config.yaml").read_text().split("\n", 1)[1])
    assert yaml.safe_load(cm["data"]["learner.yaml"])["train"]["max_steps"] == 7


@pytest.mark.slow
@pytest.mark.process
def test_fleetrl_run_on_a_local_ray_trains_the_spec(spec_file):
    """``fleetrl run --on ray``: the spec rendered for the Ray launcher, on a local Ray with an embedded Redis under
    run_dir; the learner's 2 steps are trained and checkpointed, and no secret is in the launcher's file."""
    pytest.importorskip("ray", reason="ray is in the `ray` extra: pip install -e '.[ray]' (make test-ray)")
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "FLEETRL_TOKEN", "FLEETRL_RUN_KEY")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "run", str(spec_file), "--on", "ray"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=420, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "learner finished with exit code 0" in out and "note: eval is not carried" in out
    run_dir = spec_file.parent / "run"
    steps = [int(line.split('"step": ')[1].split(",")[0].split("}")[0])
             for line in (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2
    fleet = (run_dir / "ray" / "fleet.yaml").read_text()
    password = (run_dir / "redis" / "password").read_text().strip()
    assert password not in fleet and (run_dir / "run_key").read_text().strip() not in fleet
    assert "${REDIS_URL}" in fleet


def test_a_spec_s_own_plugins_travel_with_their_folder(spec_dir):
    """``plugins`` + ``sys_path`` (a module beside the spec) reach every rendered service with the path moved onto
    the models volume, where the spec's folder is mounted (the host's path means nothing in a container)."""
    (spec_dir / "my_plugins.py").write_text("# registers nothing; importing it is enough here\n")
    raw = yaml.safe_load((spec_dir / "run.yaml").read_text())
    (spec_dir / "run.yaml").write_text(yaml.safe_dump({**raw, "plugins": ["my_plugins"]}))
    carried, _, _ = rendered("compose", spec_dir)
    for svc, cfg in carried.configs.items():
        assert cfg["plugins"] == ["my_plugins"], svc
        assert cfg["sys_path"] == ["/models"], svc
