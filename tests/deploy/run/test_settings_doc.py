"""``fleetrl settings learner|rollout|reward|run``: every field of each settings class, with type, default, bounds
and description, generated from the classes; an unknown key in any service's settings names the closest one."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from deploy.run.settings_doc import TARGETS, render, settings_class
from services.learner.settings import LearnerSettings
from services.reward.settings import RewardSettings
from services.rollout.settings import RolloutSettings
from shared.settings import SettingsError, load_settings
from shared.settings_paths import known_paths
from tests.procs import REPO


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_field_is_listed_with_a_description(target):
    text = render(target)
    heads = {line.split(":", 1)[0] for line in text.splitlines() if line and not line.startswith((" ", "#"))}
    cls = settings_class(target)
    tags = {"name", "kind", "type"}  # a union member's tag is on its header line, not a field line
    missing = {p for p in known_paths(cls) if p not in heads and p.rsplit(".", 1)[-1] not in tags}
    assert not missing
    assert "(no description)" not in text


def test_the_listing_shows_type_default_and_bounds_from_the_class():
    text = render("learner")
    lr = LearnerSettings.model_fields["optim"].default_factory().actor_lr
    assert f"optim.actor_lr: float = {lr}  (> 0.0)\n    Actor learning rate." in text
    assert "train.micro_batch_size: int = " in text and "port: int = 8003  (>= 0, <= 65535)" in text
    # the kinds as registered, so a kind registered later is listed too (not a list kept by hand here)
    from services.reward.scorer_config import SCORERS
    from services.rollout.engines.settings import ENGINES

    assert f"engine: one of {' | '.join(ENGINES.kinds())} (by kind) = kind: hf" in render("rollout")
    assert f"scorers: list[one of {' | '.join(SCORERS.kinds())} (by kind)] = required" in render("reward")
    assert "judge" in SCORERS.kinds()


@pytest.mark.process
def test_fleetrl_settings_prints_a_service_or_one_section_and_refuses_bad_names_in_one_line():
    cli = [sys.executable, "-m", "deploy.cli", "settings"]
    out = subprocess.run([*cli, "rollout", "worker"], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    fields = [line for line in out.stdout.splitlines() if line and not line.startswith((" ", "#"))]
    assert fields and all(line.startswith("worker") for line in fields)
    assert any(line.startswith("worker.concurrency: int = 8") for line in fields)
    bad = subprocess.run([*cli, "learner", "optimm"], cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: learner settings have no section 'optimm'")
    assert len(bad.stderr.strip().splitlines()) == 1
    neither = subprocess.run([*cli, "learnr"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert neither.returncode == 2 and "neither a settings class" in neither.stderr


@pytest.mark.parametrize(("cls", "config", "message"), [
    (LearnerSettings, {"model": {"actor": "m"}, "data": {"path": "d.jsonl"}, "optim": {"actor_lrr": 1e-5}},
     "optim.actor_lrr: unknown setting (did you mean optim.actor_lr?)"),
    (LearnerSettings, {"model": {"actor": "m"}, "data": {"path": "d.jsonl"}, "trian": {"max_steps": 3}},
     "trian: unknown setting (did you mean train?)"),
    (RolloutSettings, {"model": "m", "worker": {"concurency": 4}},
     "worker.concurency: unknown setting (did you mean worker.concurrency?)"),
    (RolloutSettings, {"model": "m", "engine": {"kind": "hf", "max_batch": 4}},
     "engine.max_batch: unknown setting (did you mean engine.max_batch_size?)"),
    (RewardSettings, {"scorers": [{"name": "x", "kind": "rule", "check": {"type": "exact"}, "wieght": 2}]},
     "unknown setting (did you mean scorers.weight?)"),
])
def test_an_unknown_key_in_a_service_settings_file_names_the_closest_valid_one(tmp_path, cls, config, message):
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SettingsError) as err:
        load_settings(cls, config_file=path)
    assert message in str(err.value)


def test_an_unknown_environment_variable_names_the_closest_valid_one(monkeypatch):
    monkeypatch.setenv("FLEETRL_REWARD_SCORER", "[]")
    with pytest.raises(SettingsError, match="did you mean FLEETRL_REWARD_SCORERS"):
        load_settings(RewardSettings)


def test_the_run_wide_section_is_listed_alike_for_the_learner_and_the_rollout():
    """One section (shared/run_settings.py) every service of a run holds alike: the same lines in both listings,
    and none of its fields left at a former place."""
    def run_lines(target: str) -> list[str]:
        return [line for line in render(target).splitlines() if line.startswith("run.")]

    assert run_lines("learner") == run_lines("rollout")
    heads = {line.split(":", 1)[0] for line in run_lines("learner")}
    assert heads == {"run.max_staleness", "run.prompt_claim_idle_ms", "run.max_experience_backlog"}
    for gone in ("rollout.max_staleness:", "worker.max_staleness:", "worker.claim_idle_ms:",
                 "worker.max_experience_backlog:", "sessions.max_experience_backlog:"):
        assert gone not in render("learner") + render("rollout")
