"""TensorBoard and wandb get the run's name and its configuration (fleetrl run's resolved spec through
observability.run_config, else the learner's settings); the reward curve carries held-out accuracy."""

from __future__ import annotations

import json
import sys
import types
from typing import ClassVar

import yaml
from prometheus_client import CollectorRegistry

from services.learner.observability import MetricsSink, plot_reward_curve, read_heldout
from services.learner.settings import ObservabilitySettings


class FakeWriter:
    instances: ClassVar[list[FakeWriter]] = []

    def __init__(self, logdir):
        self.logdir, self.texts = logdir, {}
        FakeWriter.instances.append(self)

    def add_text(self, tag, text, step):
        self.texts[tag] = (text, step)

    def add_scalar(self, *a):
        pass

    def close(self):
        pass


def fake_loggers(monkeypatch) -> list[dict]:
    inits: list[dict] = []
    run = types.SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: inits.append(kw) or run))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    FakeWriter.instances.clear()
    return inits


def sink(tmp_path, **obs) -> MetricsSink:
    settings = ObservabilitySettings(progress_bar=False, plot=False, tensorboard=True, wandb_project="proj", **obs)
    return MetricsSink(settings, tmp_path / "run", CollectorRegistry(), run_name="my-run",
                       config={"run_name": "my-run", "optim": {"actor_lr": 1e-6}})


def test_wandb_and_tensorboard_get_the_run_name_and_the_resolved_spec(tmp_path, monkeypatch):
    inits = fake_loggers(monkeypatch)
    spec = {"run_name": "my-run", "model": "/m", "train": {"max_steps": 300}, "eval": {"every": 50}}
    (tmp_path / "fleetrl.resolved.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    s = sink(tmp_path, run_config=str(tmp_path / "fleetrl.resolved.yaml"))
    s.open(total_steps=3, initial_step=0)
    s.close()
    assert inits[0]["project"] == "proj" and inits[0]["name"] == "my-run" and inits[0]["config"] == spec
    text, step = FakeWriter.instances[0].texts["config"]
    assert step == 0 and yaml.safe_load(text.removeprefix("```yaml\n").removesuffix("```")) == spec
    assert FakeWriter.instances[0].texts["run_name"] == ("my-run", 0)


def test_without_a_run_config_file_the_learner_settings_are_the_config(tmp_path, monkeypatch):
    inits = fake_loggers(monkeypatch)
    s = sink(tmp_path, run_config=str(tmp_path / "missing.yaml"))  # unreadable: said, then the settings
    s.open(total_steps=3, initial_step=0)
    s.close()
    assert inits[0]["config"] == {"run_name": "my-run", "optim": {"actor_lr": 1e-6}}


def test_the_reward_curve_draws_held_out_accuracy_beside_the_reward(tmp_path):
    metrics, evals = tmp_path / "metrics.jsonl", tmp_path / "eval.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "reward_mean": s / 10}) + "\n" for s in range(1, 11)))
    evals.write_text("".join(json.dumps({"step": s, "accuracy": a, "weight_version": str(s)}) + "\n"
                             for s, a in ((0, 0.2), (5, 0.4), (10, 0.3), (10, 0.5))) + "cut by a cra")
    assert read_heldout(evals) == [(0, 0.2), (5, 0.4), (10, 0.5)]  # the last per step; a torn line skipped
    out = plot_reward_curve(metrics, tmp_path / "curve.png", evals)
    plain = plot_reward_curve(metrics, tmp_path / "plain.png")
    assert out.stat().st_size > 1000 and out.read_bytes() != plain.read_bytes()
    assert read_heldout(tmp_path / "none.jsonl") == []
