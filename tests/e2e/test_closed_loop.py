"""The whole loop with real parts: Redis, the reward, rollout and learner services as processes.

Runs the demo's pipeline (``fleetrl run`` of the sort-digits recipe: SFT warm-up, then GRPO through the queue
and the weight sidecar) for a
few dozen steps and checks that the training reward rises and every published version reached
the rollout fleet.
"""

import json

import pytest

from deploy.local import demo

pytestmark = pytest.mark.process  # the whole fleet as processes


@pytest.mark.slow
def test_grpo_loop_raises_reward_and_syncs_every_version(tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)  # the demo starts its own embedded server
    rc = demo.main(["--run-dir", str(tmp_path), "--sft-steps", "50", "--rl-steps", "60", "--heldout", "100"])
    assert rc == 0, (tmp_path / "rl" / "logs" / "learner.log").read_text()[-3000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["learner_steps"] == 60
    assert summary["weight_version_before"] == "0"
    assert summary["weight_version_after"] == "60", "the rollout fleet serves the learner's last version"

    rows = [json.loads(line) for line in (tmp_path / "rl" / "learner" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    assert len(rewards) == 60
    first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
    assert last > first + 0.05, f"training reward did not rise: first 15 steps {first:.3f}, last 15 {last:.3f}"
    # the staleness bound holds for everything trained; a group that fell behind it (a replica that lagged a
    # publish on a loaded machine: seen once in a full-suite run, 24 of 7,680 samples) is dropped and its
    # prompt re-issued, which is the bound doing its job, so only a rare drop is allowed, not none
    assert max(r["staleness_max"] for r in rows if "staleness_max" in r) <= 1
    assert rows[-1]["experiences_dropped_stale"] <= 0.05 * rows[-1]["samples_trained"]
    assert (tmp_path / "rl" / "learner" / "reward_curve.png").stat().st_size > 0
