"""The ``fleetrl`` command leaves like the services do (shared/service_kit/process_exit.py): its status and output as
before, without the interpreter's teardown of every module it imported (seconds, for ``fleetrl learner``)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from tests.procs import REPO

pytestmark = pytest.mark.process  # python processes


def test_the_console_script_is_the_leaving_entry_point():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "fleetrl"]
    assert script.value == "deploy.cli:main"


@pytest.mark.parametrize(("args", "code", "says"), [
    (["plugins", "--import", "tests.deploy.cli_teardown_probe"], 0, "engine"),
    (["plugins", "--import", "tests.deploy.cli_teardown_probe", "--import", "no.such.module"], 2, "no.such.module"),
])
def test_fleetrl_exits_with_its_status_and_output_and_no_module_teardown(tmp_path, args, code, says):
    mark = tmp_path / "mark"
    done = subprocess.run([sys.executable, "-m", "deploy.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "FLEETRL_TEST_TEARDOWN_MARK": str(mark)})
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    assert says in done.stdout + done.stderr
    assert not mark.exists(), "the interpreter tore the modules down"
