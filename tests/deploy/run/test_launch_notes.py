"""What fleetrl run says and draws without starting a fleet: a data.epochs cap that stops the run before
train.max_steps is said at start; the reward curve is drawn again at the end with the held-out accuracy."""

from __future__ import annotations

import json
from pathlib import Path

from deploy.run.display import Display
from deploy.run.launch import RunLauncher
from deploy.run.load import load_spec
from deploy.run.plan import RESOLVED_SPEC, ProcessPlan, plan


class Recorder(Display):
    def __init__(self):
        self.events: list[str] = []

    def event(self, msg: str) -> None:
        self.events.append(msg)

    def update(self, view) -> None:
        pass

    def close(self) -> None:
        pass


def launcher(spec_file: Path, *sets: str) -> tuple[RunLauncher, Recorder]:
    display = Recorder()
    return RunLauncher(load_spec(spec_file, list(sets)), spec_file, display), display


def test_a_data_epochs_cap_before_max_steps_is_said_at_start(spec_file):
    capped, said = launcher(spec_file, "data.epochs=1", "train.max_steps=30")  # 40 prompts, 2 groups per step
    capped._check_data()
    assert said.events == [("data: train.max_steps 30 is more than the data holds: data.epochs 1 x 40 prompts / "
                            "train.groups_per_step 2 = 20 steps, so the run stops at step 20; raise data.epochs, or "
                            "leave it unset to cycle the prompts until max_steps")]
    cycled, said = launcher(spec_file, "train.max_steps=30")
    cycled._check_data()
    assert said.events[0].startswith("data: train.max_steps 30 x train.groups_per_step 2 = 60 prompts from 40: the "
                                     "prompts are cycled (1.5 passes")


def test_the_learner_gets_the_resolved_spec_as_its_run_config(spec_file):
    run, _ = launcher(spec_file)
    learner = plan(run.spec, spec_file, "redis://127.0.0.1:1/0", "tok")[-1]
    assert learner.config["observability"]["run_config"] == str(run.run_dir / RESOLVED_SPEC)


def test_the_reward_curve_is_drawn_again_with_held_out_accuracy(spec_file, tmp_path):
    run, said = launcher(spec_file)
    learner_dir = run.run_dir / "learner"
    learner_dir.mkdir(parents=True)
    (learner_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.1 * s}) + "\n"
                                                       for s in (1, 2)))
    (run.run_dir / "eval.jsonl").write_text(json.dumps({"step": 0, "accuracy": 0.25}) + "\n" +
                                            json.dumps({"step": 2, "accuracy": 0.5}) + "\n")
    run._plot(ProcessPlan("learner", "learner", {"run_dir": str(learner_dir), "observability": {"plot": True}}))
    assert (learner_dir / "reward_curve.png").stat().st_size > 1000
    assert said.events == [f"reward curve with held-out accuracy: {learner_dir / 'reward_curve.png'}"]
    (learner_dir / "reward_curve.png").unlink()
    run._plot(ProcessPlan("learner", "learner", {"run_dir": str(learner_dir), "observability": {"plot": False}}))
    assert not (learner_dir / "reward_curve.png").exists()  # plot: false is respected


def test_a_resumed_run_does_not_say_again_the_health_warning_an_earlier_launch_said(tmp_path, tiny_model_dir):
    """Held-out accuracy 28% -> 12% said `health: held-out accuracy fell ...` in the launch that measured it, then
    again at every resume (the same points, read back from eval.jsonl, give the same warning). A warning the
    earlier launches did not say, or one that clears and comes back, is said."""
    import json

    from deploy.run.launch import RunLauncher
    from deploy.run.load import load_spec
    from deploy.run.progress import RunView
    from tests.deploy.run.conftest import tiny_spec
    from tests.deploy.run.test_reward_preflight import Events

    spec_file = tiny_spec(tmp_path, tiny_model_dir)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "eval.jsonl").write_text("".join(json.dumps({"step": s, "accuracy": a}) + "\n"
                                                for s, a in ((0, 0.48), (25, 0.01))))

    def launch() -> tuple[RunLauncher, Events, RunView]:
        display = Events()
        launcher = RunLauncher(load_spec(spec_file), spec_file, display)
        launcher._resume_view()
        view = launcher.view
        view.learner_health = {}
        launcher._health(view)
        return launcher, display, view

    first, display, view = launch()  # no summary yet: a launch that has not said it
    (said,) = display.lines
    assert said.startswith("health: held-out accuracy fell 48% -> 1% in 25 steps")
    (run_dir / "summary.json").write_text(json.dumps({"health": view.health}))
    again, display, view = launch()
    assert display.lines == [] and view.health  # still flagged on the headline, not said again
    view.evals = view.evals[:1]
    again._health(view)  # it cleared ...
    view.evals = [*view.evals, *first.view.evals[1:]]
    again._health(view)  # ... and came back: said
    assert display.lines == [said]
