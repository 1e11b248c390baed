"""Reward-service fixtures: start the service (and stand-in servers) as real processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from shared.ports import free_port
from tests.procs import THREAD_ENV, spawn, starts_processes, stop, wait_http_ok

CHILD_ENV = THREAD_ENV  # one torch thread per service process (tests/procs.py)


class Server:
    def __init__(self, url: str, proc, log: Path):
        self.url, self.proc, self.log = url, proc, log


def start_reward_service(tmp: Path, config: dict, name: str = "reward", timeout: float = 90.0) -> Server:
    """Write ``config`` as YAML and run ``python -m services.reward`` on a free port."""
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / f"{name}.log"
    proc = spawn(["-m", "services.reward", "--config", str(cfg), "--port", str(port)], log, CHILD_ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/health", proc, timeout=timeout, log=log)
    except Exception:
        stop(proc)
        raise
    return Server(url, proc, log)


def start_openrlhf_stub(tmp: Path, port: int | None = None) -> Server:
    port = port or free_port()
    log = tmp / f"openrlhf-stub-{port}.log"
    proc = spawn(["-m", "tests.reward.openrlhf_stub_server", "--port", str(port)], log, CHILD_ENV)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/health", proc, timeout=60, log=log)
    return Server(url, proc, log)


@pytest.fixture(scope="module")
@starts_processes
def reward_service(tmp_path_factory) -> Iterator[Callable[..., Server]]:
    """Factory: ``reward_service(config_dict)`` -> running Server; all stopped at module end."""
    started: list[Server] = []
    tmp = tmp_path_factory.mktemp("reward")

    def make(config: dict, name: str = "reward") -> Server:
        server = start_reward_service(tmp, config, name=f"{name}-{len(started)}")
        started.append(server)
        return server

    yield make
    for server in started:
        stop(server.proc)


@pytest.fixture(scope="module")
@starts_processes
def openrlhf_stub(tmp_path_factory) -> Iterator[Server]:
    """The stand-in OpenRLHF serve_rm, its own process."""
    server = start_openrlhf_stub(tmp_path_factory.mktemp("openrlhf-stub"))
    yield server
    stop(server.proc)


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_part = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_part for k, v in labels.items()):
            total += float(value)
    return total


def start_judge_stub(tmp: Path) -> Server:
    """The scripted stand-in judge (tests/reward/judge_stub_server.py), its own process."""
    port = free_port()
    log = tmp / f"judge-stub-{port}.log"
    proc = spawn(["-m", "tests.reward.judge_stub_server", "--port", str(port)], log, CHILD_ENV)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/health", proc, timeout=60, log=log)
    return Server(url, proc, log)


@pytest.fixture(scope="module")
@starts_processes
def judge_stub(tmp_path_factory) -> Iterator[Server]:
    """The stand-in judge, its own process."""
    server = start_judge_stub(tmp_path_factory.mktemp("judge-stub"))
    yield server
    stop(server.proc)
