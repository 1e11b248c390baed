"""``benchmarks/tinker_vs_run.py --quick``: the RL loop through the Tinker API (sampling in the learner, and on a
rollout replica) and ``fleetrl run``'s own loop all train in one invocation, and the table has a row of figures for
each, with the load average."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tinker")

pytestmark = [pytest.mark.slow, pytest.mark.process, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(tinker|tinker-rollout|run) +(\d+\.\d+) +(\d+\.\d+) +(\d+\.\d+%) +(\d+\.\d+/\S+ -> \S+)$",
                 re.MULTILINE)


def test_quick_run_prints_a_row_per_mode(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tinker_vs_run.py"), "--quick", "--run-dir",
                           str(tmp_path)], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=840)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = {m.group(1): m.groups()[1:] for m in ROW.finditer(proc.stdout)}
    assert set(rows) == {"tinker", "tinker-rollout", "run"}, proc.stdout[-4000:]
    for mode, (s_per_step, first_step, _acc, _load) in rows.items():
        assert 0 < float(s_per_step) < 60 and 0 < float(first_step) < 600, (mode, rows[mode])
    assert "load average" in proc.stdout
    # the rollout mode's samples came from the replica, the plain one's from the learner
    assert re.search(r"tinker-rollout: sampler rollout, samples on rollout [1-9]\d*, in the learner 0", proc.stdout)
    assert re.search(r"tinker: sampler learner, samples on rollout 0, in the learner [1-9]", proc.stdout)
