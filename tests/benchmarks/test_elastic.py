"""``benchmarks/elastic.py --quick``: the three ways (fixed 1, fixed 4, elastic 1-4) run through ``fleetrl run`` on
the sleep engine and print their figures; here only that they exist and are sane (the figures themselves are
measured with the full benchmark, docs/elastic.md)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.process, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (fixed-1|fixed-4|elastic-1-4) \| ([\d.]+) \| (\d+) \| ([\d.]+|nan) \| ([\d.]+|nan) \| (\d+) \| "
                 r"(\d+) \|$", re.MULTILINE)


def test_quick_run_prints_each_way_and_the_ratios(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/elastic.py", "--quick", "--dir", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {m[0]: m[1:] for m in ROW.findall(out.stdout)}
    assert set(rows) == {"fixed-1", "fixed-4", "elastic-1-4"}, out.stdout
    for way, (wall, steps, first, second, replica_s, most) in rows.items():
        wall, replica_s = float(wall), float(replica_s)
        assert int(steps) == 12 and 5 < wall < 300, (way, rows[way])
        assert float(first) > 0 and float(second) > 0, (way, rows[way])
        # replica-seconds: each replica's lifetime until the learner finished, at most the wall time each
        assert 0 < replica_s <= int(most) * wall + 1, (way, rows[way])
    assert rows["fixed-1"][5] == "1" and rows["fixed-4"][5] == "4" and 1 <= int(rows["elastic-1-4"][5]) <= 4
    assert float(rows["fixed-4"][4]) > 3 * float(rows["fixed-1"][4]) * 0.5  # four replicas, alive the whole run
    assert re.search(r"elastic / fixed-4 wall time: [\d.]+x \(target <= 1.15x: (met|NOT met)\)", out.stdout)
    assert re.search(r"elastic / fixed-4 replica-seconds: \d+% \(target <= 60%: (met|NOT met)\)", out.stdout)
    assert (tmp_path / "elastic.md").is_file()
