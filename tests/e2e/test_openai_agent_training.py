"""An agent on the plain ``openai`` client trains through FLEETRL by its base URL alone: ``fleetrl run`` with the
rollout workers running ``openai_agent`` (the program of tests/rollout/agents/openai_agent_program.py per sample,
two chat turns with a follow-up message between them, its own reward), the learner's GRPO steps on what its
sessions recorded (the follow-up's tokens masked), every step's weights published to the replica that serves
the program's next calls."""

from __future__ import annotations

import json

import pytest

from tests.deploy.run.conftest import tiny_spec
from tests.deploy.run.test_fleetrl_run import fleetrl_run, metrics

pytestmark = pytest.mark.process  # the whole fleet as processes


@pytest.mark.slow
def test_an_openai_client_agent_trains_through_sessions(tmp_path, tiny_model_dir):
    program = {"command": ["{python}", "-m", "tests.rollout.agents.openai_agent_program"], "timeout_s": 60,
               "reward_from_output": True}  # the reward lines below are the program's
    spec = tiny_spec(tmp_path, tiny_model_dir, run_name="openai-agent-e2e", eval={"data": None},
                     train={"groups_per_step": 2, "micro_batch_size": 8, "max_steps": 3, "torch_threads": 1},
                     services={"rollout": {"engine": {"kind": "hf", "device": "cpu", "torch_threads": 1},
                                           "sessions": {"enabled": True},
                                           "worker": {"rollout_function": "openai_agent", "program": program}},
                               "learner": {"model": {"device": "cpu"}, "observability": {"plot": False}}})
    run = fleetrl_run(spec, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [r for r in metrics(tmp_path / "run") if "step" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # 2 groups x 2 samples of the program's episodes per step, their follow-up tokens untrained
        assert r["samples"] == 4 and r["environment_tokens_mean"] > 0
        assert r["reward_mean"] == pytest.approx(1.0)  # the program's reward lines: index + 0.5 for index 0, 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3
    log = (tmp_path / "run" / "logs" / "rollout-0.log").read_text()
    assert "weights v3" in log or "version 3" in log, log[-2000:]


def test_held_out_evaluation_of_an_openai_agent_run_is_refused_up_front(tmp_path, tiny_model_dir):
    program = {"command": ["{python}", "-m", "tests.rollout.agents.openai_agent_program"]}
    spec = tiny_spec(tmp_path, tiny_model_dir, run_name="openai-agent-eval",
                     services={"rollout": {"sessions": {"enabled": True},
                                           "worker": {"rollout_function": "openai_agent", "program": program}}})
    run = fleetrl_run(spec, timeout=120)
    assert run.returncode != 0
    assert "held-out evaluation of an openai_agent run is not supported" in run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
