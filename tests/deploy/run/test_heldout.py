"""Held-out evaluation during a run: a pass whose answers span a weight update is taken again, and the last try
is kept with its versions said as a range (under async RL the learner can publish faster than a pass takes)."""

from __future__ import annotations

import pytest

from deploy.local.evaluate import GreedyPass, one_version
from deploy.run import heldout


def test_one_version_is_the_single_version_or_the_range_when_mixed_is_allowed():
    assert one_version({"7"}) == "7" and one_version({"7"}, mixed_ok=True) == "7"
    with pytest.raises(RuntimeError, match="several weight versions"):
        one_version({"83", "84"})
    assert one_version({"9", "10", "84"}, mixed_ok=True) == "9-84"  # numeric order, not text order
    with pytest.raises(RuntimeError):
        one_version(set(), mixed_ok=True)


def test_a_pass_spanning_updates_is_retried_then_kept_with_its_range(monkeypatch, tmp_path):
    calls = []

    def passes(rollout_url, reward_url, rows, *, max_new_tokens, mixed_ok=False, reward_token=None,
               success_threshold=1.0):
        calls.append(mixed_ok)
        return GreedyPass(0.5, 0.75, one_version({"83", "84"}, mixed_ok), [])  # the fleet updates during every pass

    monkeypatch.setattr(heldout, "greedy_pass", passes)
    log = tmp_path / "eval.jsonl"
    point = heldout.evaluate("http://rollout", "http://reward", [{"input": "x", "label": "y"}], step=80,
                             max_new_tokens=4, log_path=log, attempts=3)
    assert calls == [False, False, True]  # two strict tries, then the last one keeps the mixed pass
    assert (point.step, point.accuracy, point.weight_version) == (80, 0.5, "83-84")
    assert '"weight_version": "83-84"' in log.read_text() and '"mean_reward": 0.75' in log.read_text()
