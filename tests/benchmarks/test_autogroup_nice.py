"""``benchmarks/autogroup_nice.py``: the command runs at the nice value given, and a process of it that starts a session
of its own gets its autogroup's nice set too."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks import autogroup_nice as A

pytestmark = pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroups on this kernel")

CHILD = """
import os, sys, time
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not open('/proc/self/autogroup').read().strip().endswith('nice 7'):
    time.sleep(0.05)
open(sys.argv[1], 'w').write(f"{os.nice(0)} {open('/proc/self/autogroup').read().strip()}")
"""


def test_nice_of_reads_a_process_nice_value() -> None:
    assert A.nice_of(str(os.getpid())) == os.nice(0)
    assert A.nice_of("999999999") is None


def test_a_command_in_a_session_of_its_own_gets_its_autogroup_reniced(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    code = A.main(["--nice", "7", "--autogroup-nice", "7", "--", "setsid", sys.executable, "-c", CHILD, str(out)])
    assert code == 0
    nice, group = out.read_text().split(" ", 1)
    assert int(nice) == 7
    assert group.endswith("nice 7"), group


def test_no_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        A.main(["--nice", "-10"])
    assert exc.value.code == 2
