"""Fixtures: the rollout service as a real process on the tiny model (shared by the tests here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from shared.ports import free_port
from tests.procs import THREAD_ENV, spawn, starts_processes, stop, wait_http_ok

CONTROL_TOKEN = "test-control-token"
MAX_INFLIGHT = 160
MAX_BODY = 256 * 1024
PAUSE_WAIT_S = 1.5

# THREAD_ENV: one torch thread per service process (tests/procs.py), imported here for the files that use it


@dataclass
class Server:
    url: str
    log: Path
    model_dir: Path


def write_config(path: Path, **settings) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def start_rollouts(tmp: Path, configs: dict[str, dict], extra_env: dict | None = None) -> list[tuple]:
    """One rollout service process per ``{name: config}``, started side by side (start-up is mostly imports and
    model loading, so N at once take little longer than one); ``[(proc, url, log)]`` in order, all healthy."""
    started = []
    for name, config in configs.items():
        if "run_key" not in config:  # these tests write and read the queue by hand, without the run's key
            config = {"allow_unsigned_records": True, **config}
        port = free_port()
        cfg = write_config(tmp / f"{name}.yaml", port=port, **config)
        log = tmp / f"{name}.log"
        proc = spawn(["-m", "services.rollout", "--config", str(cfg)], log, env={**THREAD_ENV, **(extra_env or {})})
        started.append((proc, f"http://127.0.0.1:{port}", log))
    try:
        for proc, url, log in started:
            wait_http_ok(f"{url}/health", proc, timeout=120, log=log)
    except Exception:
        for proc, _, _ in started:
            stop(proc)
        raise
    return started


def start_rollout(tmp: Path, name: str, config: dict, extra_env: dict | None = None):
    return start_rollouts(tmp, {name: config}, extra_env)[0]


@pytest.fixture(scope="session")
@starts_processes
def rollout(tiny_model_dir, tmp_path_factory) -> Server:
    """hf engine, control token set, small limits so the capacity paths are reachable in tests."""
    tmp = tmp_path_factory.mktemp("rollout")
    config = {
        "model": str(tiny_model_dir),
        "served_model_name": "tiny",
        "control_token": CONTROL_TOKEN,
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 64, "max_wait_ms": 5, "torch_threads": 1},
        "limits": {"max_inflight_sequences": MAX_INFLIGHT, "max_body_bytes": MAX_BODY, "pause_wait_s": PAUSE_WAIT_S},
    }
    proc, url, log = start_rollout(tmp, "rollout", config)
    yield Server(url=url, log=log, model_dir=Path(tiny_model_dir))
    stop(proc)
