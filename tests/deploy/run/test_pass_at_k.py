"""``fleetrl eval --samples K``: sampled accuracy and the unbiased pass@k estimator beside greedy accuracy."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest

from deploy.local.fleet import Fleet
from deploy.run.sampled_eval import ks_for, pass_at_k
from tests.deploy.run.test_fleetrl_run import ENV
from tests.procs import REPO


@pytest.mark.parametrize(("n", "c"), [(4, 0), (4, 1), (4, 2), (5, 3), (6, 6), (8, 1)])
def test_pass_at_k_is_the_chance_a_k_subset_holds_a_correct_sample(n, c):
    samples = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(combinations(samples, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    with pytest.raises(ValueError):
        pass_at_k(n, c, n + 1)


def test_reported_ks():
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]


# a reward that a random tiny model earns about half the time (its byte-level answers start with a printable
# ASCII character or not), so sampled accuracy is neither 0 nor 1 and two unseeded passes would differ
HALF = [{"name": "ascii", "kind": "rule", "check": {"type": "format", "pattern": "^[ -~]"}}]


@pytest.fixture()
def served(tmp_path, tiny_model_dir):
    """A reward service with :data:`HALF` and a rollout replica (no worker) serving the tiny model."""
    with Fleet(run_dir=tmp_path / "fleet") as fleet:
        reward = fleet.start("reward", "services.reward", {"scorers": HALF}, wait=False)
        rollout = fleet.start("rollout", "services.rollout", {
            "model": str(tiny_model_dir), "weight_sidecar": False, "worker": {"enabled": False},
            "engine": {"kind": "hf", "device": "cpu", "torch_threads": 1}}, wait=False)
        fleet.wait_healthy("reward")
        fleet.wait_healthy("rollout")
        yield rollout.url, reward.url


def _eval(spec_file, rollout_url: str, reward_url: str, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "deploy.cli", "eval", str(spec_file), "--rollout-url", rollout_url,
                          "--set", f"reward={json.dumps({'url': reward_url})}", *extra],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.process
def test_fleetrl_eval_samples_reports_sampled_accuracy_and_pass_at_k(spec_file, served):
    result = _eval(spec_file, *served, "--samples", "8", "--temperature", "1.0", "--seed", "7")
    assert result["n"] == 8 and 0.0 <= result["accuracy"] <= 1.0  # greedy, as before
    sampled = result["sampled"]
    assert sampled["samples_per_prompt"] == 8 and sampled["temperature"] == 1.0 and sampled["seed"] == 7
    assert sampled["weight_versions"] == ["0"]
    assert 0.0 < sampled["accuracy"] < 1.0, sampled
    p = sampled["pass_at_k"]
    assert list(p) == ["1", "2", "4", "8"] and p["1"] == pytest.approx(sampled["accuracy"])
    assert 0.0 <= p["1"] <= p["2"] <= p["4"] <= p["8"] <= 1.0
    # every sampled answer is in sampled.jsonl, prompt-major, with the reward that the accuracy counted
    rows = [json.loads(line) for line in Path(result["sampled_file"]).read_text().splitlines()]
    assert len(rows) == 8 * result["n"] and [r["sample"] for r in rows[:8]] == list(range(8))
    assert len({r["prompt"] for r in rows[:8]}) == 1 and {"completion", "label", "reward"} <= set(rows[0])
    assert sum(r["reward"] >= 1.0 for r in rows) / len(rows) == pytest.approx(sampled["accuracy"])
    # --seed: the same model gives the same sampled figures again
    again = _eval(spec_file, *served, "--samples", "8", "--temperature", "1.0", "--seed", "7")
    assert again["sampled"] == sampled
    assert [json.loads(line) for line in Path(again["sampled_file"]).read_text().splitlines()] == rows
