"""Every config file the deployments mount loads with the services' own settings classes (a typo in a
deploy file would otherwise only show when a container starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.ray.settings import LaunchSettings, merge
from services.learner.settings import LearnerSettings
from services.reward.settings import RewardSettings
from services.rollout.settings import RolloutSettings
from shared.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
CLASSES = {"reward": RewardSettings, "rollout": RolloutSettings, "learner": LearnerSettings}


def compose_configs():
    return sorted((REPO / "deploy/compose/config").glob("*.yaml"))


def _load(kind: str, path: Path, model_dir: Path):
    if kind == "rollout":
        return load_settings(RolloutSettings, path, model=str(model_dir))
    if kind == "learner":
        return load_settings(LearnerSettings, path)
    return load_settings(RewardSettings, path)


@pytest.mark.parametrize("path", compose_configs(), ids=lambda p: p.name)
def test_compose_configs_are_valid_settings(path, tiny_model_dir, monkeypatch):
    for var in [v for v in __import__("os").environ if v.startswith("FLEETRL_")]:
        monkeypatch.delenv(var)
    kind = path.stem.split("-")[0]
    settings = _load(kind, path, tiny_model_dir)
    assert settings.port == {"reward": 8002, "rollout": 8001, "learner": 8003}[kind]


@pytest.mark.parametrize("key", ["reward.yaml", "rollout.yaml", "learner.yaml"])
def test_k8s_configmap_entries_are_valid_settings(key, tiny_model_dir, tmp_path):
    docs = yaml.safe_load((REPO / "deploy/k8s/config.yaml").read_text())
    path = tmp_path / key
    path.write_text(docs["data"][key])
    _load(key.removesuffix(".yaml"), path, tiny_model_dir)


def test_ray_example_config_is_valid(tiny_model_dir, tmp_path):
    s = LaunchSettings.from_file(REPO / "deploy/ray/fleet.example.yaml")
    assert (s.reward.replicas, s.rollout.replicas, s.learner.replicas) == (2, 4, 1)
    wiring = {"rollout": {"worker": {"reward_url": "http://reward-0:8002"}}}  # what the launcher fills in
    for kind, group in (("reward", s.reward), ("rollout", s.rollout), ("learner", s.learner)):
        path = tmp_path / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(merge(group.settings(), wiring.get(kind, {}))))
        _load(kind, path, tiny_model_dir)


def test_ray_settings_reject_a_rollout_fleet_without_reward():
    with pytest.raises(ValueError, match="reward.replicas"):
        LaunchSettings(redis_url="redis://x:6379/0", reward={"replicas": 0})
