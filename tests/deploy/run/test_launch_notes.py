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
