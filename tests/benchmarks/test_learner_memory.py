"""``benchmarks/learner_memory.py`` on CPU, small: every setup it has (fsdp on one rank too, MFU with a given
peak) runs, the state halves over two fsdp ranks, and the last line is the ratio the docs quote."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_the_memory_benchmark_runs_every_setup_and_ends_with_the_fsdp_ratio():
    cmd = [sys.executable, str(REPO / "benchmarks" / "learner_memory.py"), "--hidden", "64", "--layers", "4",
           "--steps", "1", "--groups", "2", "--micro", "2", "--response", "24", "--setups", "torch:1,fsdp:1,fsdp:2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETRL_PEAK_TFLOPS": "0.05"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    rows = {}
    for ln in lines:
        m = re.match(r"(torch|fsdp) x(\d)\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+(\S*%?)\s*float32$", ln)
        if m:
            rows[(m.group(1), int(m.group(2)), int(m.group(3)))] = (float(m.group(4)), float(m.group(5)), m.group(7))
    assert set(rows) == {("torch", 1, 0), ("fsdp", 1, 0), ("fsdp", 2, 0), ("fsdp", 2, 1)}, lines
    state, peak = rows[("torch", 1, 0)][:2]
    assert rows[("fsdp", 2, 0)][0] == pytest.approx(state / 2, rel=0.02)  # parameters, gradients, Adam: halved
    assert rows[("fsdp", 1, 0)][0] == pytest.approx(state, rel=0.02)
    assert rows[("torch", 1, 0)][2].endswith("%") and rows[("fsdp", 2, 0)][2].endswith("%")  # MFU, rank 0
    ratio = re.fullmatch(r"fsdp 2 ranks / torch 1 rank, peak memory per rank: (\d\.\d\d)x", lines[-1])
    assert ratio, lines[-1]
    assert float(ratio.group(1)) == pytest.approx(max(rows[("fsdp", 2, r)][1] for r in (0, 1)) / peak, abs=0.01)
    assert float(ratio.group(1)) < 1.0
