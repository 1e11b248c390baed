"""Container entrypoint: wait for dependencies, optionally start an engine server, then run the service.

``python -m deploy.docker.entrypoint CMD...`` (the images' ENTRYPOINT; CMD is the service).

- ``FLEETRL_WAIT_FOR``: space- or comma-separated targets that must be ready first —
  ``http(s)://...`` (answers 200: another service's ``/health``), ``tcp://host:port`` (accepts a
  connection: Redis), ``file:/path`` (exists: the model the init service writes). Compose's
  ``depends_on: service_healthy`` does the same where health checks run; podman-compose runs none, and
  Kubernetes has no ordering at all, so the containers do not rely on it.
- ``FLEETRL_WAIT_TIMEOUT_S`` (default 900): give up (exit 3) after this long, naming what is missing.
- ``FLEETRL_ENGINE_CMD`` + ``FLEETRL_ENGINE_HEALTH``: GPU rollout images start the engine server (vLLM,
  SGLang) as a child, wait for its health URL, then run the service beside it; when either exits the
  other is stopped and the container exits with that code, so the orchestrator restarts the pair. SIGTERM
  (``docker stop``, a compose scale-down) goes to the service alone; the engine is stopped once the service
  exited, so a draining replica finishes its groups on a live engine.

Standard library only: it also runs in the engines' own images.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit


def _http_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tcp_ready(target: str) -> bool:
    parts = urlsplit(target)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=3):
            return True
    except OSError:
        return False


def _file_ready(target: str) -> bool:
    return Path(target.removeprefix("file:").removeprefix("//")).exists()


CHECKS: dict[str, Callable[[str], bool]] = {
    "http": _http_ready, "https": _http_ready, "tcp": _tcp_ready, "file": _file_ready,
}


def parse_targets(spec: str) -> list[str]:
    """Targets from ``FLEETRL_WAIT_FOR``; raises ValueError naming one with an unknown scheme."""
    targets = [t for t in spec.replace(",", " ").split() if t]
    for t in targets:
        if t.split(":", 1)[0] not in CHECKS:
            raise ValueError(f"FLEETRL_WAIT_FOR: {t!r} must start with one of {sorted(CHECKS)} (e.g. tcp://redis:6379)")
    return targets


def wait_for(targets: list[str], timeout_s: float, poll_s: float = 1.0) -> list[str]:
    """Wait until every target is ready; returns the ones still missing when ``timeout_s`` ran out."""
    pending = list(targets)
    deadline = time.monotonic() + timeout_s
    while pending:
        pending = [t for t in pending if not CHECKS[t.split(":", 1)[0]](t)]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    return pending


def say(msg: str) -> None:
    print(f"[entrypoint] {msg}", file=sys.stderr, flush=True)


def supervise(engine_cmd: str, engine_health: str, service: list[str], timeout_s: float) -> int:
    """Run the engine server and the service side by side; when one exits, stop the other."""
    engine = subprocess.Popen(shlex.split(engine_cmd), start_new_session=True)
    procs = [engine]
    stopping = {"sig": None}

    def forward(signum, _frame):
        # The service first, alone: a rollout replica drains on SIGTERM (docs/elastic.md), finishing the groups it
        # holds on the engine, so the engine must outlive it. The engine is stopped once the service exited
        # (_run_pair), or at once while no service runs yet.
        stopping["sig"] = signum
        service_running = len(procs) > 1 and procs[1].poll() is None
        for p in procs[1:] if service_running else procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _run_pair(engine, engine_health, service, timeout_s, procs, stopping, forward)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_pair(engine, engine_health, service, timeout_s, procs, stopping, forward) -> int:
    deadline = time.monotonic() + timeout_s
    while not _http_ready(engine_health):
        if engine.poll() is not None or stopping["sig"] or time.monotonic() > deadline:
            say(f"engine server not healthy at {engine_health} (exit code {engine.poll()})")
            forward(signal.SIGTERM, None)
            return engine.wait() or 1
        time.sleep(2.0)
    say(f"engine server healthy at {engine_health}; starting {' '.join(service)}")
    procs.append(subprocess.Popen(service))
    while all(p.poll() is None for p in procs):
        time.sleep(0.5)
    first = next(p for p in procs if p.poll() is not None)
    forward(signal.SIGTERM, None)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    return first.returncode


def main(argv: list[str]) -> int:
    if not argv:
        say("usage: python -m deploy.docker.entrypoint COMMAND [ARGS...]")
        return 2
    timeout_s = float(os.environ.get("FLEETRL_WAIT_TIMEOUT_S", "900"))
    try:
        targets = parse_targets(os.environ.get("FLEETRL_WAIT_FOR", ""))
    except ValueError as exc:
        say(str(exc))
        return 2
    if targets:
        say(f"waiting for {' '.join(targets)}")
        missing = wait_for(targets, timeout_s)
        if missing:
            say(f"gave up after {timeout_s:.0f}s; not ready: {' '.join(missing)}")
            return 3
        say("dependencies ready")
    engine_cmd = os.environ.get("FLEETRL_ENGINE_CMD", "").strip()
    if engine_cmd:
        health = os.environ.get("FLEETRL_ENGINE_HEALTH", "http://127.0.0.1:30000/health")
        return supervise(engine_cmd, health, argv, timeout_s)
    os.execvp(argv[0], argv)
    return 0  # unreachable


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
