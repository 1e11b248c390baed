"""Fixtures: a rollout service process with session mode on (tiny model, a private Redis of this folder's own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.redis_server import EmbeddedRedis
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
def redis_server(tmp_path_factory) -> EmbeddedRedis:
    """This folder's own private Redis (it overrides tests/conftest.py's): ``session_rollout`` lives for the whole
    session and keeps the experience stream's consumer group it made, which the ``redis_client`` FLUSHALL of a
    test elsewhere would drop under it (under ``make test``'s xdist workers other files' tests run in between;
    ``/sessions/{id}/finish`` then answered 500 NOGROUP)."""
    server = EmbeddedRedis(data_dir=tmp_path_factory.mktemp("routes-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
@starts_processes
def session_rollout(tiny_model_dir, redis_server, tmp_path_factory) -> Server:
    """Session mode on, default limits."""
    tmp = tmp_path_factory.mktemp("session-rollout")
    proc, url, log = start_rollout(tmp, "rollout", session_config(tiny_model_dir, redis_server.url))
    yield Server(url=url, log=log, model_dir=Path(tiny_model_dir))
    stop(proc)
