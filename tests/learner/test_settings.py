"""Learner settings: file + env + flags, and validators whose messages say how to fix the problem."""

from pathlib import Path

import pytest
import yaml

from services.learner.settings import LearnerSettings
from shared.settings import SettingsError, load_settings

CONFIGS = Path(__file__).resolve().parents[2] / "services" / "learner" / "configs"


@pytest.mark.parametrize("name", ["grpo.yaml", "ppo.yaml", "sft.yaml"])
def test_shipped_configs_parse(name):
    s = load_settings(LearnerSettings, CONFIGS / name)
    assert s.algorithm.name == name.split(".")[0]


def test_env_overrides_nested_sections(tmp_path, monkeypatch):
    cfg = tmp_path / "l.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"actor": "m"}, "data": {"path": "d.jsonl"},
                                   "optim": {"actor_lr": 1e-5}, "algorithm": {"name": "rloo"}}))
    monkeypatch.setenv("FLEETRL_LEARNER_OPTIM__ACTOR_LR", "3e-4")
    s = load_settings(LearnerSettings, cfg, port=9100)
    assert s.optim.actor_lr == 3e-4 and s.port == 9100 and s.algorithm.name == "rloo"
    assert s.checkpoint_dir == Path("runs/learner/checkpoints")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"data": {}}, "data.path is required"),
        ({"rollout": {"group_size": 1}}, "group_size >= 2"),
        ({"rollout": {"window": 2}, "train": {"groups_per_step": 4}}, "must be >= train.groups_per_step"),
        ({"train": {"freeze_actor_steps": 3}}, "only applies to algorithm.name=ppo"),
        ({"algorithm": {"name": "grpo", "policy_loss": {"kind": "ppo", "eps_low": 1.5}}}, "eps_low"),
        ({"algorithm": {"name": "ppo", "kl": {"estimator": "k4"}}}, "estimator"),
        ({"backend": {"name": "deepspeed", "zero_stage": 1}}, "zero_stage"),
        ({"optim": {"actor_lr": 1e-5, "lr": 1}}, "unknown setting"),
    ],
)
def test_invalid_settings_say_what_to_fix(patch, message, tmp_path):
    base = {"model": {"actor": "m"}, "data": {"path": "d.jsonl"}, "algorithm": {"name": "grpo"}}
    for k, v in patch.items():
        base[k] = v
    cfg = tmp_path / "l.yaml"
    cfg.write_text(yaml.safe_dump(base))
    with pytest.raises(SettingsError, match=message):
        load_settings(LearnerSettings, cfg)


def test_heartbeat_must_be_under_the_collective_timeout(tmp_path):
    with pytest.raises(ValueError, match="heartbeat_s must be below"):
        LearnerSettings(model={"actor": "m"}, data={"path": "d.jsonl"},
                        distributed={"timeout_s": 10, "heartbeat_s": 30})
