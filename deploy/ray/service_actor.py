"""A Ray actor that runs one FleetRL service process and watches it.

The service stays what it is everywhere else (``python -m services.<svc> --config FILE``, speaking
HTTP, Redis and the weight-sync group); the actor only places it on a node, starts it, and dies with
it: when the process exits with an error the actor exits too, so Ray restarts the actor (and with it
the process) up to ``max_restarts``. The process gets SIGKILL when the actor dies (PR_SET_PDEATHSIG),
so a killed actor never leaves a service behind holding its port.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import ray
import yaml

from deploy.private_files import write_private
from shared.ports import free_port

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class ServiceProcessActor:
    """One replica: ``spec`` = {name, module, settings, port, env, workdir}; see launcher.replica_spec."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.name = spec["name"]
        self.node_ip = ray.util.get_node_ip_address()
        self.port = int(spec["port"]) or free_port("0.0.0.0")
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        settings = {**spec["settings"], "host": "0.0.0.0", "port": self.port}
        self.dir = Path(tempfile.mkdtemp(prefix=f"fleetrl-{self.name}-"))  # 0700
        config = write_private(self.dir / "config.yaml", yaml.safe_dump(settings, sort_keys=False))  # the token
        self.log_path = self.dir / "service.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **spec.get("env", {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (spec["workdir"], env.get("PYTHONPATH")) if p)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", spec["module"], "--config", str(config)], cwd=spec["workdir"], env=env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
            )
        self.stopping = False
        threading.Thread(target=self._watch, name=f"watch-{self.name}", daemon=True).start()

    def _watch(self) -> None:
        code = self.proc.wait()
        if self.stopping or code == 0:
            return
        print(f"[{self.name}] service exited with code {code}; ending the actor so Ray restarts it:\n"
              f"{self.log_tail(2000)}", file=sys.stderr, flush=True)
        os._exit(1)

    # ---- queried by the launcher -------------------------------------------------------------------
    def url(self) -> str:
        return f"http://{self.node_ip}:{self.port}"

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url(), "pid": self.proc.pid, "actor_pid": os.getpid(),
                "returncode": self.proc.poll(), "restarted": self.restarted, "log": str(self.log_path)}

    def wait_healthy(self, timeout_s: float, path: str = "/health") -> str:
        """Block until the service answers 200 on ``path``; raise with its log tail if it does not. A service that
        exited with code 0 meanwhile has done its work (a short learner run can train, checkpoint and exit between
        two polls): its URL is returned and the launcher's ``wait`` reads the exit code."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() == 0:
                    return self.url()
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    r = client.get(self.url() + path)
                    if r.status_code == 200:
                        return self.url()
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                time.sleep(0.3)
        raise TimeoutError(f"{self.name} not healthy after {timeout_s:.0f}s ({last}):\n{self.log_tail()}")

    def returncode(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def leave(self) -> None:
        """The replica is about to be drained out of an elastic pool: its exit ends neither the actor nor starts a
        new one (the launcher kills the actor once the process has exited)."""
        self.stopping = True

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the actor itself stays (the launcher kills it)."""
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode
