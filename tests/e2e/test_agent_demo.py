"""``make demo-agent``, small: the agent-calculator recipe through ``fleetrl run`` with real processes (Redis, the
reward, rollout and learner services): an SFT warm-up on tool-use transcripts, then GRPO on multi-turn rollouts
with the calculator environment. Checks that what was trained were multi-turn episodes with tool turns (the
environment's tokens in the responses, masked), that held-out success is measured with greedy episodes before
and after, and that the sample episodes are rendered with their tool calls.
"""

import json

import pytest

from deploy.local import demo_agent

pytestmark = pytest.mark.process  # the whole fleet as processes


@pytest.mark.slow
def test_agent_demo_trains_multi_turn_tool_episodes(tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)  # the demo starts its own embedded server
    # mostly tool-use transcripts (the recipe's mix is 60% direct answers: what RL has to learn away) so that the
    # few trained steps hold tool turns
    rc = demo_agent.main(["--run-dir", str(tmp_path), "--sft-examples", "200", "--sft-steps", "60", "--sft-direct", "0.2",
                          "--rl-steps", "6", "--groups-per-step", "4", "--group-size", "4", "--heldout", "40",
                          "--lines"])
    assert rc == 0, (tmp_path / "rl" / "logs" / "learner.log").read_text()[-3000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["learner_steps"] == 6
    assert (summary["weight_version_before"], summary["weight_version_after"]) == ("0", "6")
    rows = [json.loads(line) for line in (tmp_path / "rl" / "learner" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "environment_tokens_mean" in r]
    assert len(trained) == 6 and all(r["samples"] == 16 for r in trained)
    # the warm-up taught the call format: the trained episodes hold tool turns (the template's ids and the tool's
    # result, ~12 tokens each), context the loss does not train on
    assert sum(r["environment_tokens_mean"] for r in trained) / 6 > 4
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in trained)

    evals = [json.loads(line) for line in (tmp_path / "rl" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 6] and all(e["n"] == 40 for e in evals)
    # the share of held-out episodes that called the tool, what RL is to raise, in the log and the summary
    assert all(0.0 <= e["tool_call_rate"] <= 1.0 for e in evals)
    assert summary["heldout_tool_call_rate_after_rl"] == evals[-1]["tool_call_rate"]
    for step in (0, 6):
        samples = (tmp_path / "rl" / f"heldout_samples_step{step}.md").read_text()
        assert "<tool_call>" in samples and "environment (mask 0)" in samples and "<|im_start|>tool" in samples
