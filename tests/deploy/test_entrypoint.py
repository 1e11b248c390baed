"""The containers' entrypoint: waits for Redis / health routes / files before starting the service,
gives up naming what is missing, and supervises an engine server beside the service."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deploy.docker import entrypoint

REPO = Path(__file__).resolve().parents[2]


class _Health(BaseHTTPRequestHandler):
    status = 503

    def do_GET(self):
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def health_server():
    handler = type("H", (_Health,), {"status": 503})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, handler
    server.shutdown()


def test_unknown_scheme_is_rejected_with_an_example():
    with pytest.raises(ValueError, match="tcp://redis:6379"):
        entrypoint.parse_targets("redis:6379")
    assert entrypoint.parse_targets("tcp://a:1, http://b/health  file:/x") == ["tcp://a:1", "http://b/health", "file:/x"]


def test_waits_until_health_answers_200(health_server):
    server, handler = health_server
    url = f"http://127.0.0.1:{server.server_port}/health"
    threading.Timer(0.6, lambda: setattr(handler, "status", 200)).start()
    t0 = time.monotonic()
    assert entrypoint.wait_for([url], timeout_s=10, poll_s=0.1) == []
    assert time.monotonic() - t0 >= 0.5, "a 503 is not ready"


def test_tcp_and_file_targets(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    marker = tmp_path / "READY"
    threading.Timer(0.3, marker.touch).start()
    targets = [f"tcp://127.0.0.1:{listener.getsockname()[1]}", f"file:{marker}"]
    assert entrypoint.wait_for(targets, timeout_s=10, poll_s=0.1) == []
    listener.close()


@pytest.mark.process
def test_gives_up_naming_what_is_missing(tmp_path):
    env = {"FLEETRL_WAIT_FOR": f"file:{tmp_path}/never tcp://127.0.0.1:1", "FLEETRL_WAIT_TIMEOUT_S": "0.5",
           "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "deploy.docker.entrypoint", "true"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 3
    assert f"file:{tmp_path}/never" in r.stderr and "tcp://127.0.0.1:1" in r.stderr


@pytest.mark.process
def test_execs_the_command_once_ready(tmp_path):
    (tmp_path / "READY").touch()
    env = {"FLEETRL_WAIT_FOR": f"file:{tmp_path}/READY", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "deploy.docker.entrypoint", sys.executable, "-c", "print('served')"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "served"


@pytest.mark.process
def test_supervisor_stops_the_engine_when_the_service_exits(tmp_path):
    port_file = tmp_path / "engine.pid"
    engine = (f"{sys.executable} -c \"import os,http.server as h; open('{port_file}','w').write(str(os.getpid())); "
              f"h.ThreadingHTTPServer(('127.0.0.1', {_free_port()}), h.SimpleHTTPRequestHandler).serve_forever()\"")
    port = int(engine.split("'127.0.0.1', ")[1].split(")")[0])
    code = entrypoint.supervise(engine, f"http://127.0.0.1:{port}/", [sys.executable, "-c", "raise SystemExit(7)"],
                                timeout_s=30)
    assert code == 7, "the container exits with the service's code"
    pid = int(port_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), \
        "the engine server was stopped"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.process
def test_sigterm_drains_the_service_on_a_live_engine_then_stops_the_engine(tmp_path):
    """A GPU rollout container stopped by compose (scale-down) or Kubernetes: SIGTERM goes to the service, which
    drains on the engine (here: asks the engine's health route 0.5 s later), and only then is the engine stopped."""
    port = _free_port()
    engine_pid, seen = tmp_path / "engine.pid", tmp_path / "seen"
    engine = (f"{sys.executable} -c \"import os,http.server as h; open('{engine_pid}','w').write(str(os.getpid())); "
              f"h.ThreadingHTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()\"")
    service = tmp_path / "service.py"
    service.write_text(f"""
import signal, sys, time, urllib.request
def drain(*_):
    time.sleep(0.5)  # a group still generating on the engine
    try:
        urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=5)
        open({str(seen)!r}, 'w').write('engine up')
    except OSError as exc:
        open({str(seen)!r}, 'w').write(f'engine gone: {{exc}}')
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
open({str(seen)!r} + '.ready', 'w').write('1')
while True:
    time.sleep(0.1)
""")
    env = {"FLEETRL_ENGINE_CMD": engine, "FLEETRL_ENGINE_HEALTH": f"http://127.0.0.1:{port}/", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "deploy.docker.entrypoint", sys.executable, str(service)],
                            cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30  # the engine's health poll (2 s) and two interpreters starting
        while not Path(f"{seen}.ready").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert Path(f"{seen}.ready").exists(), "the service never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, "the container exits with the drained service's code"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen.read_text() == "engine up", "the engine was stopped before the service drained"
    pid = int(engine_pid.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), \
        "the engine server was stopped after the service"


@pytest.mark.process
def test_the_service_replaces_the_entrypoint_so_it_gets_the_containers_signals(tmp_path):
    """No supervisor in between without an engine: the service runs as the entrypoint's own process (PID 1 in the
    container), so `docker stop`'s SIGTERM reaches it."""
    proc = subprocess.Popen([sys.executable, "-m", "deploy.docker.entrypoint", sys.executable, "-c",
                             "import os; print(os.getpid())"], cwd=REPO, env={"PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    assert int(out.strip()) == proc.pid
