"""Services against a Redis that requires a password (issue 26): started without it, or with a wrong one, each
exits at once with a one-line error that names the setting — not a hang, not a traceback — and shows no
password. Real processes, the real (authenticated) test Redis."""

from __future__ import annotations

import subprocess
import time
from urllib.parse import urlsplit

import pytest

from tests.learner.test_process import write_config
from tests.procs import REPO, run_module

pytestmark = pytest.mark.process  # starts service processes (tests/procs.py)

ENV_KEYS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}


def without_password(url: str) -> str:
    parts = urlsplit(url)
    return f"redis://{parts.hostname}:{parts.port}/0"


def run_service(args: list[str], tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETRL_") and k != "REDIS_URL"}
    t0 = time.monotonic()
    done = run_module(["-m", *args], cwd=tmp_path, env={**env, **ENV_KEYS}, timeout=120)
    return done, time.monotonic() - t0


def assert_one_line_error(done: subprocess.CompletedProcess, password: str) -> str:
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "Traceback" not in out and password not in out, out[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "redis_url" in errors[0] and "password" in errors[0], done.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("wrong", [False, True], ids=["no-password", "wrong-password"])
def test_a_service_without_the_password_fails_fast_naming_the_setting(redis_server, tiny_model_dir, tmp_path, wrong):
    password = redis_server.password
    assert password, "the test Redis requires a password"
    url = without_password(redis_server.url)
    if wrong:
        url = url.replace("redis://", "redis://:not-the-password@")
    rollout, took = run_service(["services.rollout", "--model", str(tiny_model_dir), "--redis-url", url,
                                 "--port", "0"], tmp_path)
    line = assert_one_line_error(rollout, password)
    assert took < 60 and ("gives none" in line) != wrong, line
    cfg, _ = write_config(tmp_path, tiny_model_dir, url, n_prompts=4)
    learner, took = run_service(["services.learner", "--config", str(cfg)], tmp_path)
    assert_one_line_error(learner, password)
    assert took < 90
    if wrong:
        assert "not-the-password" not in learner.stderr + rollout.stderr  # a wrong password is not shown either


def assert_names_the_run_key(done: subprocess.CompletedProcess) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "run_key is unset" in errors[0] and "allow_unsigned_records: true" in errors[0], \
        done.stderr[-3000:]


def test_a_service_that_shares_queue_records_needs_the_run_key(redis_server, tiny_model_dir, tmp_path):
    """A rollout worker and an RL learner on a shared Redis without a run_key would take records anyone there wrote:
    each exits at start with one line naming run_key and the opt-out, allow_unsigned_records."""
    rollout, took = run_service(["services.rollout", "--model", str(tiny_model_dir), "--redis-url", redis_server.url,
                                 "--port", "0", "--worker", "--reward-url", "http://127.0.0.1:9"], tmp_path)
    assert_names_the_run_key(rollout)
    assert took < 60
    cfg, _ = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=4, allow_unsigned_records=False)
    learner, took = run_service(["services.learner", "--config", str(cfg)], tmp_path)
    assert_names_the_run_key(learner)
    assert took < 90
