"""``fleetrl eval``: held-out accuracy of a model directory through a rollout replica and the spec's reward."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.deploy.run.test_fleetrl_run import ENV
from tests.procs import REPO

pytestmark = pytest.mark.process  # runs `fleetrl eval` as a process


def test_fleetrl_eval_prints_the_accuracy_of_a_model(spec_file, tiny_model_dir):
    out = subprocess.run([sys.executable, "-m", "services.cli", "eval", str(spec_file), "--model", str(tiny_model_dir)],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["n"] == 8 and 0.0 <= result["accuracy"] <= 1.0 and result["weight_version"] == "0"
    assert result["model"] == str(tiny_model_dir)
    none = subprocess.run([sys.executable, "-m", "services.cli", "eval", str(spec_file), "--set", "eval.data=null"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60, check=False)
    assert none.returncode == 1 and none.stderr.strip().startswith("error: eval.data is not set")
