"""Fixtures: a rollout service process with session mode on (tiny model, the tests' private Redis)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.procs import starts_processes, stop
from tests.rollout.conftest import CONTROL_TOKEN, Server, start_rollout

AUTH = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
RUN = "sessions-test"


def session_config(model_dir: Path, redis_url: str, **sessions) -> dict:
    return {
        "model": str(model_dir),
        "served_model_name": "tiny",
        "control_token": CONTROL_TOKEN,
        "redis_url": redis_url,
        "run_name": RUN,
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 16, "max_wait_ms": 2, "torch_threads": 1},
        "sessions": {"enabled": True, **sessions},
    }


@pytest.fixture(scope="session")
@starts_processes
def session_rollout(tiny_model_dir, redis_server, tmp_path_factory) -> Server:
    """Session mode on, default limits."""
    tmp = tmp_path_factory.mktemp("session-rollout")
    proc, url, log = start_rollout(tmp, "rollout", session_config(tiny_model_dir, redis_server.url))
    yield Server(url=url, log=log, model_dir=Path(tiny_model_dir))
    stop(proc)
