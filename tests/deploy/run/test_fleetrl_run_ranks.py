"""``fleetrl run`` with ``replicas.learner: 2``: two learner ranks on this machine (gloo), started and watched by
the launcher itself (no torchrun), train a GRPO run whose sharded checkpoint the same command then resumes on one
rank, exporting a plain Hugging Face model at the end."""

from __future__ import annotations

import json

import pytest

from tests.deploy.run.conftest import tiny_spec
from tests.deploy.run.test_fleetrl_run import fleetrl_run, metrics

pytestmark = [pytest.mark.slow, pytest.mark.process]  # two whole fleets, the first with two learner ranks


@pytest.mark.timeout(1200)
def test_two_learner_ranks_train_and_the_run_resumes_on_one(tmp_path, tiny_model_dir):
    spec_file = tiny_spec(tmp_path, tiny_model_dir, export="final-model", replicas={"learner": 2})
    run_dir = tmp_path / "run"
    first = fleetrl_run(spec_file, "eval.data=null", timeout=600)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-3000:]
    assert "rank 0 of 2" in out and "starting learner ranks 1 to 1 (learner-rank-1 ...)" in out, out[-3000:]
    follower = (run_dir / "logs" / "learner-rank-1.log").read_text()
    assert "learner rank 1/2 following rank 0" in follower and "stopping after 2 steps" in follower, follower[-2000:]
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]
    trainer = run_dir / "learner" / "checkpoints" / "step-00000002" / "trainer"
    assert json.loads((trainer / "state.json").read_text())["world_size"] == 2
    assert len(list((trainer / "state").glob("*.safetensors"))) == 2  # each rank wrote its shards

    again = fleetrl_run(spec_file, "eval.data=null", "replicas.learner=1", "train.max_steps=3", timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "resuming from" in out and "learner-rank-1" not in out.split("resuming from", 1)[1]
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3]  # continued on one rank at step 3
    assert "resumed the sharded checkpoint" in (run_dir / "logs" / "learner.log").read_text()
    export = tmp_path / "final-model"
    assert (export / "config.json").is_file() and list(export.glob("*.safetensors"))
