"""Helpers for integration tests that run services as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def starts_processes(fixture_fn):
    """Put under ``@pytest.fixture``: the fixture starts service processes, so every test that uses it (directly
    or through another fixture) gets the ``process`` marker (tests/conftest.py) and ``make test-fast`` skips it."""
    fixture_fn.starts_processes = True
    return fixture_fn


def spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``python <args>`` from the repo root in its own process group, logging to ``log_path``."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen([sys.executable, *args], cwd=REPO, env=full_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_http_ok(url: str, proc: subprocess.Popen | None = None, timeout: float = 90.0, log: Path | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-4000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready:\n{tail}")
        try:
            r = httpx.get(url, timeout=5.0)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.25)
    tail = log.read_text()[-4000:] if log and log.exists() else ""
    raise TimeoutError(f"{url} not ready after {timeout}s (last: {last})\n{tail}")


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (a crash, not a shutdown)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
