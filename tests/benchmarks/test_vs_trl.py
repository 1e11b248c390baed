"""``benchmarks/vs_trl.py --quick``: TRL's GRPOTrainer and ``fleetrl run`` both train, and the printed table has a row
of figures for each, with the fleet's start-up and step trace."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="TRL is in the dev extras (pip install -e '.[dev]')")

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"(\d+(?:\.\d+)?)"
ROW = re.compile(rf"^(trl|fleet-s1) +0 +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER}% ", re.MULTILINE)


def test_quick_run_prints_both_rows_and_the_trace(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "vs_trl.py"), "--quick", "--run-dir",
                           str(tmp_path)], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=840)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = {m.group(1): [float(x) for x in m.groups()[1:]] for m in ROW.finditer(proc.stdout)}
    assert set(rows) == {"trl", "fleet-s1"}, proc.stdout[-4000:]
    for mode, (s_per_step, first_step, last_step, wall, _final) in rows.items():
        assert 0 < s_per_step < 60, (mode, rows[mode])
        assert 0 < first_step <= last_step <= wall, (mode, rows[mode])  # launch -> step 1 -> last step -> exit
    assert "s/step" in proc.stdout and "x TRL's" in proc.stdout  # the fleet's ratio to TRL
    trace = proc.stdout[proc.stdout.index("fleet-s1 seed 0: start-up"):]
    assert "learner: step 1 trained" in trace and "rollout: engine's model loaded" in trace, trace
    assert "zygote: imports done" in trace and "learner: forked from the zygote" in trace, trace
    assert re.search(r"a step \(medians, ms\): \d+ = train \d+ \+ wait for experiences \d+", trace), trace
