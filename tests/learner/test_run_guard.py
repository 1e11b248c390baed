"""A fresh learner on a run name an earlier run left processed sample ids under refuses to start, with a
message that says what to do, instead of dropping every new experience as a duplicate."""

import os
import subprocess
import sys

import pytest
import redis

from services.learner.run_guard import stale_run_problem
from shared import keys
from tests.learner.test_process import ENV, write_config
from tests.procs import REPO


@pytest.fixture()
def client(redis_server):
    c = redis.Redis.from_url(redis_server.url, socket_timeout=10)
    c.flushall()
    yield c
    c.close()


def run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **ENV}, capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.process
def test_a_fresh_learner_on_a_used_run_name_exits_with_what_to_do(tmp_path, tiny_model_dir, redis_server, client):
    client.sadd(keys.processed_ids("proc", "learner"), "e0-0-0", "e0-0-1")
    cfg, _ = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=8)
    out = run("-m", "services.learner", "--config", str(cfg), timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: run_name 'proc' was used before"), out.stderr
    assert "2 sample ids" in lines[0] and "new run_name" in lines[0] and "fleetrl queue clear" in lines[0]
    assert "Traceback" not in out.stderr + out.stdout


def test_a_resumable_or_unused_run_is_not_refused(tmp_path, redis_server, client):
    ckpt = tmp_path / "checkpoints"
    assert stale_run_problem(redis_server.url, "fresh", ckpt, resume=True) is None  # never used
    client.sadd(keys.processed_ids("fresh", "learner"), "e0-0-0")
    assert "no checkpoint in" in stale_run_problem(redis_server.url, "fresh", ckpt, resume=True)
    (ckpt / "step-00000002").mkdir(parents=True)
    (ckpt / "step-00000002" / "COMPLETE").write_text("{}")
    assert stale_run_problem(redis_server.url, "fresh", ckpt, resume=True) is None  # resumes: ids match its state
    assert "checkpoint.resume is off" in stale_run_problem(redis_server.url, "fresh", ckpt, resume=False)


@pytest.mark.process
def test_fleetrl_queue_clear_lets_the_name_start_afresh(tmp_path, redis_server, client):
    client.sadd(keys.processed_ids("old", "learner"), "e0-0-0")
    client.xadd(keys.prompts_stream("old"), {"a": "1"})
    client.sadd(keys.processed_ids("other", "learner"), "e0-0-0")
    out = run("-m", "deploy.cli", "queue", "clear", "--run-name", "old", "--redis-url", redis_server.url, "--yes",
              timeout=60)
    assert out.returncode == 0 and "deleted 2 keys" in out.stdout, out.stderr
    assert stale_run_problem(redis_server.url, "old", tmp_path / "none", resume=True) is None
    assert client.exists(keys.processed_ids("other", "learner"))  # other runs are untouched
