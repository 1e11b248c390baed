"""``fleetrl eval --samples K``: sampled accuracy and the unbiased pass@k estimator beside greedy accuracy."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import combinations

import pytest

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


def test_fleetrl_eval_samples_reports_sampled_accuracy_and_pass_at_k(spec_file, tiny_model_dir):
    out = subprocess.run([sys.executable, "-m", "services.cli", "eval", str(spec_file), "--model", str(tiny_model_dir),
                          "--samples", "4", "--temperature", "1.0"],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["n"] == 8 and 0.0 <= result["accuracy"] <= 1.0  # greedy, as before
    sampled = result["sampled"]
    assert sampled["samples_per_prompt"] == 4 and sampled["temperature"] == 1.0
    assert sampled["weight_versions"] == ["0"]
    p = sampled["pass_at_k"]
    assert list(p) == ["1", "2", "4"] and p["1"] == pytest.approx(sampled["accuracy"])
    assert 0.0 <= p["1"] <= p["2"] <= p["4"] <= 1.0
