"""Helpers for integration tests that run services as real processes."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from deploy.local.zygote import ForkedProcess, Zygote, ZygoteError

REPO = Path(__file__).resolve().parents[1]

THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""What most service processes of the tests run with (one torch thread each): the test zygote's environment."""
FORKABLE = ("services.", "tests.")  # ``python -m`` modules a test may fork from the zygote (not third parties')
_zygote: Zygote | None = None
_zygote_tried = False
_zygote_lock = threading.Lock()


def _forkable_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without what pytest changes on every test (``PYTEST_CURRENT_TEST``): a service reads nothing of it,
    and the zygote forks only into the environment it imported under (but for run-time variables)."""
    return {k: v for k, v in env.items() if k != "PYTEST_CURRENT_TEST"}


def _test_zygote() -> Zygote | None:
    """This test process's zygote (deploy/local/zygote.py), started at its first use: it imports torch,
    transformers and the services once, and ``spawn`` forks service processes from it instead of starting a fresh
    interpreter that imports them again (~3 CPU-seconds each). None with ``FLEETRL_TEST_ZYGOTE=0`` (or where the
    product has no zygote: ``FLEETRL_ZYGOTE=0``, a host with an NVIDIA driver)."""
    global _zygote, _zygote_tried
    with _zygote_lock:
        if not _zygote_tried:
            _zygote_tried = True
            if os.environ.get("FLEETRL_TEST_ZYGOTE", "1") != "0":
                env = _forkable_env({**os.environ, "PYTHONUNBUFFERED": "1", **THREAD_ENV})
                log = Path(tempfile.gettempdir()) / f"fleetrl-test-zygote-{os.getpid()}.log"
                _zygote = Zygote.start(env, log, extra=["transformers.models.llama.modeling_llama"])
                if _zygote is not None:
                    atexit.register(_zygote.close)
        return _zygote


def starts_processes(fixture_fn):
    """Put under ``@pytest.fixture``: the fixture starts service processes, so every test that uses it (directly
    or through another fixture) gets the ``process`` marker (tests/conftest.py) and ``make test-fast`` skips it."""
    fixture_fn.starts_processes = True
    return fixture_fn


def _not_forked(args: list[str], exc: Exception) -> None:
    """With ``PYTEST_CPU_LOG=PATH`` (tests/conftest.py): why one of our modules was started afresh, not forked, in
    ``PATH.not-forked.<worker>``."""
    if path := os.environ.get("PYTEST_CPU_LOG"):
        with open(f"{path}.not-forked.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a") as log:
            log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{' '.join(args)[:120]}\t{exc}\n")


def spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen | ForkedProcess:
    """Start ``python <args>`` from the repo root in its own process group, logging to ``log_path``: forked from
    the test zygote when ``args`` is ``-m <one of our modules> ...`` and the environment is the zygote's (but for
    ranks and ``FLEETRL_*`` settings), else a fresh interpreter. One torch thread (:data:`THREAD_ENV`) unless
    ``env`` says otherwise."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **THREAD_ENV, **(env or {})}
    log_path.write_bytes(b"")  # each start begins its log afresh (the fork and the spawn below append)
    if len(args) >= 2 and args[0] == "-m" and args[1].startswith(FORKABLE) and (zygote := _test_zygote()):
        try:
            return zygote.fork(args[1], list(args[2:]), log_path, _forkable_env(full_env))
        except ZygoteError as exc:  # the environment differs, or the zygote broke: a fresh interpreter
            log_path.write_text(f"tests.procs: spawned, not forked from the test zygote ({exc})\n")
            _not_forked(args, exc)
    with open(log_path, "ab") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen([sys.executable, *args], cwd=REPO, env=full_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def run_module(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str] | None = None,
               timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)`` (``env`` None: this process's environment with :data:`THREAD_ENV`), forked from the test zygote when ``args`` is
    ``-m <one of our modules> ...`` and the environment is the zygote's but for run-time variables (a
    ``PYTHONPATH`` naming only the repository, which the zygote has on its path, aside): a command-line start
    that refuses or exits costs no fresh import of torch and transformers (~3 CPU-seconds each). Raises
    ``subprocess.TimeoutExpired`` as ``subprocess.run`` does (the process group killed first)."""
    full_env = dict({**os.environ, **THREAD_ENV} if env is None else env)
    if full_env.get("PYTHONPATH") in (str(REPO), f"{REPO}/"):
        full_env.pop("PYTHONPATH")
    zygote = _test_zygote() if len(args) >= 2 and args[0] == "-m" and args[1].startswith(FORKABLE) else None
    if zygote is not None:
        with tempfile.TemporaryDirectory(prefix="fleetrl-run-module-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            try:
                proc = zygote.fork(args[1], list(args[2:]), out, _forkable_env({"PYTHONUNBUFFERED": "1", **full_env}),
                                   cwd=Path(cwd) if cwd is not None else REPO, err_path=err)
            except ZygoteError as exc:
                proc = None
                _not_forked(args, exc)
            if proc is not None:
                try:
                    code = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    kill9(proc)  # type: ignore[arg-type]
                    raise
                return subprocess.CompletedProcess([sys.executable, *args], code,
                                                   out.read_text(errors="replace"), err.read_text(errors="replace"))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout, check=False)


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


def one_error_line(out: subprocess.CompletedProcess, code: int = 2) -> str:
    """A service that refused to start: exit ``code`` and exactly one ``error:`` line on stderr, no traceback.
    Returns that line."""
    assert out.returncode == code, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    return errors[0]
