"""Run FleetRL services as local processes: start, wait for health, stop — also on Ctrl-C.

Each service runs as ``python -m services.<name> --config FILE`` in its own process group, with
its output in ``<run_dir>/logs/<name>.log`` — spawned, or forked from a :class:`~deploy.local.zygote.Zygote` that
has imported torch and the services once (``Fleet(zygote=...)``; ``fleetrl run`` uses one). The fleet stops everything it started, in reverse
order, with SIGTERM then SIGKILL; a Redis it started itself is shut down last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from deploy.local.zygote import ForkedProcess, Zygote, ZygoteError, service_env
from deploy.private_files import private_dir, write_private
from shared.ports import free_port
from shared.redis_server import EmbeddedRedis, resolve_redis_url

REPO = Path(__file__).resolve().parents[2]
HEALTH_POLL_S = 0.05  # a health check is one local GET; with held-out data the step-0 evaluation waits on it


class FleetError(RuntimeError):
    """A service failed to start or died; the message carries the tail of its log."""


@dataclass
class ServiceProcess:
    name: str
    proc: subprocess.Popen | ForkedProcess
    log_path: Path
    url: str
    module: str = ""
    config_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Fleet:
    """The processes of one local FleetRL deployment."""

    run_dir: Path
    redis_url: str | None = None
    threads_per_service: int = 1
    services: dict[str, ServiceProcess] = field(default_factory=dict)
    zygote: Zygote | None = None  # services are forked from it where it can (else spawned); closed by stop_all
    _redis: EmbeddedRedis | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        private_dir(self.run_dir / "configs")  # the configs carry the control token

    def start_redis(self) -> str:
        """Use the fleet's ``redis_url`` if given, else start an embedded server under the run dir."""
        self.redis_url, self._redis = resolve_redis_url(self.redis_url, self.run_dir)
        return self.redis_url

    def write_config(self, name: str, config: dict) -> Path:
        """``<run_dir>/configs/<name>.yaml``, mode 0600 (it may hold the control token)."""
        return write_private(self.run_dir / "configs" / f"{name}.yaml", yaml.safe_dump(config, sort_keys=False))

    def start(self, name: str, module: str, config: dict, *, health_path: str = "/health",
              wait: bool = True, timeout: float = 180.0, env: dict[str, str] | None = None) -> ServiceProcess:
        """Start ``python -m <module> --config <run_dir>/configs/<name>.yaml`` and wait for its health route."""
        config = dict(config)
        config.setdefault("port", free_port())
        if self.redis_url and module != "services.reward":
            config.setdefault("redis_url", self.redis_url)
        path = self.write_config(name, config)
        log_path = self.run_dir / "logs" / f"{name}.log"
        proc_env = service_env(self.threads_per_service, env)
        proc = self._launch(module, path, log_path, proc_env)
        svc = ServiceProcess(name, proc, log_path, f"http://{config.get('host', '127.0.0.1')}:{config['port']}",
                             module=module, config_path=path, env=proc_env)
        self.services[name] = svc
        if wait:
            self.wait_healthy(name, health_path, timeout)
        return svc

    def restart(self, name: str, *, health_path: str = "/health", wait: bool = True,
                timeout: float = 180.0) -> ServiceProcess:
        """Start a service again with the same module, config file (so the same port) and log file, e.g. after
        it was killed; a service still running is stopped first."""
        svc = self.services[name]
        if svc.alive:
            _stop_group(svc.proc, 20.0)
        assert svc.config_path is not None, f"{name} was not started by this fleet"
        svc.proc = self._launch(svc.module, svc.config_path, svc.log_path, svc.env)
        if wait:
            self.wait_healthy(name, health_path, timeout)
        return svc

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to the service's whole process group (SIGKILL: a crash; SIGSTOP/SIGCONT: a hang)."""
        svc = self.services[name]
        try:
            os.killpg(svc.proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGKILL:
            svc.proc.wait(timeout=10)

    def _launch(self, module: str, config_path: Path, log_path: Path,
                env: dict[str, str]) -> subprocess.Popen | ForkedProcess:
        """Forked from the zygote where it can, else spawned."""
        if self.zygote is not None:
            try:
                return self.zygote.fork(module, ["--config", str(config_path)], log_path, env)
            except ZygoteError as exc:
                with open(log_path, "a") as log:
                    log.write(f"fleet: spawned, not forked from the zygote ({exc})\n")
        return _spawn(module, config_path, log_path, env)

    @property
    def redis_server(self) -> EmbeddedRedis | None:
        """The embedded Redis this fleet started (None when it uses an external one)."""
        return self._redis

    def wait_healthy(self, name: str, path: str = "/health", timeout: float = 180.0) -> None:
        """Until the service answers 200 on ``path``. One that exited with code 0 in the meantime has done its
        work (a learner with few steps can train, checkpoint and exit between two polls): that is not a failure,
        its caller sees the exit code; any other exit raises with the service's log tail."""
        svc = self.services[name]
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if not svc.alive and svc.proc.returncode == 0:
                    return
                if not svc.alive:
                    raise FleetError(f"{name} exited with code {svc.proc.returncode} while starting:\n{svc.log_tail()}")
                try:
                    r = client.get(svc.url + path)
                    if r.status_code == 200:
                        return
                    last = f"HTTP {r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                time.sleep(HEALTH_POLL_S)
        raise FleetError(f"{name} not healthy after {timeout:.0f}s ({last}):\n{svc.log_tail()}")

    def check_alive(self, *names: str) -> None:
        """Raise FleetError if one of the named services (default: all) has died."""
        for name in names or tuple(self.services):
            svc = self.services[name]
            if not svc.alive:
                raise FleetError(f"{name} died with code {svc.proc.returncode}:\n{svc.log_tail()}")

    def stop(self, name: str, timeout: float = 20.0) -> int | None:
        svc = self.services.pop(name, None)
        if svc is None:
            return None
        return _stop_group(svc.proc, timeout)

    def stop_all(self) -> None:
        for name in reversed(list(self.services)):
            self.stop(name)
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        if self._redis is not None:
            self._redis.stop()
            self._redis = None

    def __enter__(self) -> Fleet:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()


def _spawn(module: str, config_path: Path, log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", module, "--config", str(config_path)], cwd=REPO, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _stop_group(proc: subprocess.Popen | ForkedProcess, timeout: float) -> int | None:
    if proc.poll() is not None:
        return proc.returncode
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.wait(timeout=10)
    except ProcessLookupError:
        return proc.wait(timeout=10)
