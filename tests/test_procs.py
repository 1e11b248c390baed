"""tests/procs.py's ``run_module``: what ``subprocess.run([python, "-m", ...], capture_output=True)`` returns,
forked from the test zygote for our own modules (no fresh import of torch and transformers)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.procs import run_module

pytestmark = pytest.mark.process


def test_run_module_forks_ours_and_returns_what_subprocess_run_would(tmp_path):
    cfg = tmp_path / "probe.cfg"
    cfg.write_text(json.dumps({"report": str(tmp_path / "report.json"), "exit": 3}))
    (work := tmp_path / "work").mkdir()
    forked = run_module(["-m", "tests.deploy.zygote_probe", "--config", str(cfg)], cwd=work)
    assert forked.returncode == 3
    assert forked.stdout == "probe says hello on stdout\n" and forked.stderr == "probe says hello on stderr\n"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["cwd"] == str(work)
    assert report["preloaded"] == ["decimal", "fractions"]  # the zygote's imports: it was forked, not spawned
    fresh = run_module(["-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)"])
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (4, "out\n", "err\n")  # not ours: a fresh interpreter


def test_run_module_times_out_as_subprocess_run_does(tmp_path):
    cfg = tmp_path / "probe.cfg"
    cfg.write_text(json.dumps({"report": str(tmp_path / "report.json"), "sleep": 60}))
    with pytest.raises(subprocess.TimeoutExpired):
        run_module(["-m", "tests.deploy.zygote_probe", "--config", str(cfg)], timeout=1.0)
