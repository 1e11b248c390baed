"""A service process leaves at once after its orderly shutdown (shared/service_kit/process_exit.py, issue 28): what
the interpreter's exit does (threads joined, atexit handlers, logging flushed, stdout flushed, its exit status) is
done, its teardown of every module (seconds after importing torch and transformers) is not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from deploy.local.zygote import Zygote, service_env
from tests.procs import REPO

pytestmark = pytest.mark.process  # python processes

PROBE = "tests.shared.exit_probe"


def run_probe(tmp_path, **config) -> tuple[int, str]:
    (tmp_path / "cfg.json").write_text(json.dumps({"dir": str(tmp_path), **config}))
    with open(tmp_path / "out.txt", "wb") as out:
        code = subprocess.run([sys.executable, "-m", PROBE, "--config", str(tmp_path / "cfg.json")], cwd=REPO,
                              stdout=out, stderr=subprocess.STDOUT, timeout=60, check=False,
                              env={**os.environ, "PYTHONUNBUFFERED": ""}).returncode
    return code, (tmp_path / "out.txt").read_text()


def left(tmp_path) -> set[str]:
    return {name for name in ("atexit", "thread", "teardown") if (tmp_path / name).exists()}


def test_an_orderly_exit_keeps_everything_but_the_teardown(tmp_path):
    code, out = run_probe(tmp_path, code=0)
    assert code == 0
    assert left(tmp_path) == {"atexit", "thread"}  # the thread was joined, the atexit handler ran, no teardown
    assert (tmp_path / "probe.log").read_text() == "the last line of the log\n"
    assert out == "unflushed output"


def test_the_plain_interpreter_tears_its_modules_down(tmp_path):
    """The control: the same process ended by the interpreter itself runs the module teardown (what took
    seconds in a service), which ``run_main`` leaves out."""
    code, out = run_probe(tmp_path, code=0, plain=True)
    assert code == 0 and left(tmp_path) == {"atexit", "thread", "teardown"} and out == "unflushed output"


@pytest.mark.parametrize(("config", "status", "text"), [
    ({"code": 3}, 3, ""),  # uvicorn's start failure
    ({"code": 2}, 2, ""),  # a bad setting
    ({"end": "none"}, 0, ""),
    ({"end": "text"}, 1, "a message instead of a code"),
    ({"end": "raise"}, 1, "RuntimeError: the probe failed on purpose"),
    ({"end": "interrupt"}, -signal.SIGINT, "KeyboardInterrupt"),
])
def test_the_exit_status_and_output_are_the_interpreters(tmp_path, config, status, text):
    (tmp_path / "plain").mkdir()
    plain_code, plain_out = run_probe(tmp_path / "plain", **config, plain=True)
    code, out = run_probe(tmp_path, **config)
    assert code == plain_code == status, out
    assert text in out and "unflushed output" in out
    if "Traceback" in plain_out:  # the same exception, from the same line (the frames above main() differ)
        assert "Traceback" in out and out.splitlines()[-3:] == plain_out.splitlines()[-3:], (out, plain_out)
    else:
        assert out == plain_out, (out, plain_out)
    assert left(tmp_path) == {"atexit", "thread"}
    assert (tmp_path / "probe.log").read_text() == "the last line of the log\n"


def test_a_service_forked_from_the_zygote_leaves_the_same_way(tmp_path):
    zygote = Zygote.start(service_env(1), tmp_path / "zygote.log", preload=("json",))
    assert zygote is not None
    try:
        (tmp_path / "cfg.json").write_text(json.dumps({"dir": str(tmp_path), "code": 3}))
        proc = zygote.fork(PROBE, ["--config", str(tmp_path / "cfg.json")], tmp_path / "out.txt", service_env(1))
        assert proc.wait(timeout=60) == 3
    finally:
        zygote.close()
    assert left(tmp_path) == {"atexit", "thread"}
    assert (tmp_path / "probe.log").read_text() == "the last line of the log\n"
    assert (tmp_path / "out.txt").read_text() == "unflushed output"
