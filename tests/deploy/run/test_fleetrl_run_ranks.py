"""``fleetrl run`` with ``replicas.learner: 2``: two learner ranks on this machine (gloo), started and watched by
the launcher itself (no torchrun), train a PPO run (the policy, the reference and the critic each sharded over
the two ranks) whose sharded checkpoint the same command then resumes on one rank, critic included, exporting a
plain Hugging Face model at the end. GRPO on two ranks is this run without the critic (the same launcher, the
same lockstep passes; trained against one rank in tests/learner/training/test_fsdp.py): one fleet here covers
both, two would cost the suite another start-up."""

from __future__ import annotations

import json
import math

import pytest

from tests.deploy.run.conftest import tiny_spec
from tests.deploy.run.test_fleetrl_run import fleetrl_run, metrics

pytestmark = [pytest.mark.slow, pytest.mark.process]  # two whole fleets, the first with two learner ranks


def _critic_shards(trainer_dir) -> list[dict[str, float]]:
    """Per rank's shard file: the critic's value-head weight entries and Adam moments it holds (summed |x|)."""
    from safetensors import safe_open

    out = []
    for path in sorted((trainer_dir / "state").glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            out.append({k: float(f.get_tensor(k).abs().sum()) for k in f.keys() if k.startswith("critic.")})  # noqa: SIM118 - safe_open is not iterable
    return out


@pytest.mark.timeout(1200)
def test_two_learner_ranks_train_ppo_and_the_run_resumes_on_one(tmp_path, tiny_model_dir):
    spec_file = tiny_spec(tmp_path, tiny_model_dir, export="final-model", replicas={"learner": 2})
    run_dir = tmp_path / "run"
    ppo = ("algorithm.name=ppo", "optim.critic_lr=0.001")
    first = fleetrl_run(spec_file, "eval.data=null", *ppo, timeout=600)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-3000:]
    assert "rank 0 of 2" in out and "starting learner ranks 1 to 1 (learner-rank-1 ...)" in out, out[-3000:]
    follower = (run_dir / "logs" / "learner-rank-1.log").read_text()
    assert "learner rank 1/2 following rank 0" in follower and "stopping after 2 steps" in follower, follower[-2000:]
    rows = metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:  # the critic trained on both ranks' shards: a value loss and a gradient every step
        assert math.isfinite(m["value_loss"]) and m["value_loss"] > 0, m
        assert m["critic_grad_norm"] > 0, m
    trainer = run_dir / "learner" / "checkpoints" / "step-00000002" / "trainer"
    state = json.loads((trainer / "state.json").read_text())
    assert state["world_size"] == 2 and sorted(state["engines"]) == ["actor", "critic"]
    shards = _critic_shards(trainer)
    assert len(shards) == 2  # each rank wrote its shards, the critic's among them
    for held in shards:  # each rank holds part of the critic's weights and the Adam moments its steps made
        assert any(".exp_avg_sq" in k and v > 0 for k, v in held.items()), sorted(held)[:5]
        assert any(k.startswith("critic.model.") and v > 0 for k, v in held.items()), sorted(held)[:5]

    again = fleetrl_run(spec_file, "eval.data=null", *ppo, "replicas.learner=1", "train.max_steps=3", timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "resuming from" in out and "learner-rank-1" not in out.split("resuming from", 1)[1]
    rows = metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3]  # continued on one rank at step 3, the critic with it
    assert math.isfinite(rows[2]["value_loss"]) and rows[2]["critic_grad_norm"] > 0
    assert "resumed the sharded checkpoint" in (run_dir / "logs" / "learner.log").read_text()
    export = tmp_path / "final-model"
    assert (export / "config.json").is_file() and list(export.glob("*.safetensors"))
