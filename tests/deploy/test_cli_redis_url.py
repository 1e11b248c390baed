"""``--redis-url`` of every ``fleetrl`` command that reads a run's Redis (queue stats, queue clear, weights status):
a URL without its scheme is a usage error naming the option and how to write it (redis-py raised a ValueError out
of the command: a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.procs import REPO


@pytest.mark.parametrize("command", [["queue", "stats"], ["queue", "clear", "--yes"], ["weights", "status"]])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_redis_url_without_its_scheme_is_a_usage_error_naming_the_option(command, how):
    args = [*command, "--run-name", "x"] + (["--redis-url", "localhost:6379"] if how == "flag" else [])
    env = {**os.environ, **({"REDIS_URL": "localhost:6379"} if how == "env" else {})}
    out = subprocess.run([sys.executable, "-m", "deploy.cli", *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    said = " ".join(out.stderr.replace("│", " ").split())
    assert "Traceback" not in out.stderr and "Invalid value for '--redis-url'" in said
    assert "'localhost:6379' is not a Redis URL: use redis://[:password@]host:port/db" in said
