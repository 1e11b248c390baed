"""A fork server for the fleet's Python services: one process imports torch, transformers, the web stack and the
services' modules once, then forks each service from that state, so no service imports them again.

Without it every service of a ``fleetrl run`` imports the same ~4 s of modules (torch, transformers and the
``torch.distributed.tensor`` / ``torch._dynamo`` / sympy it pulls, pydantic models, FastAPI) at the same time,
each on a core the others want; with it the machine does that once, while the launcher does its checks.

**Protocol** (JSON lines): the zygote writes ``{"ready": ..., "preloaded": [...], "failed": {...}}`` once it has
imported what it was asked to; then, per request ``{"module", "argv", "log", "cwd", "env"}`` (and optionally
``"err"``: stderr to a file of its own, not the log) on its stdin, it
answers ``{"pid": N}`` (a service started) or ``{"error": "..."}`` (nothing started: the caller spawns the service
the ordinary way). EOF on stdin ends the zygote; the services it forked live on.

**The service process** is what ``python -m <module> <argv...>`` would be, except that its imports are
already done:

- forked twice, so that it is a child of the launcher (a subreaper while it waits for the pid: :func:`subreaper`):
  the launcher waits for it, reads its exit code and signals its process group as for a ``subprocess.Popen`` child
  (:class:`ForkedProcess`);
- its own session and process group (``start_new_session``), stdin ``/dev/null``, stdout and stderr appended to
  its log, the signal dispositions of a fresh interpreter, numpy's global RNG reseeded (Python's ``random``
  reseeds itself at fork; torch's default seed is a constant in every process anyway), torch's thread count set
  from ``OMP_NUM_THREADS``;
- it runs the module with :func:`runpy.run_module` as ``__main__`` from the zygote's top level, so the
  interpreter's own exit (``SystemExit`` codes, tracebacks, atexit, joining threads) is that of ``python -m``.

**Fork safety**: a process that has started threads must not fork (a lock another thread holds stays held in the
child; an OpenMP pool that ran is broken in it). The zygote runs no torch op, and it refuses to fork (the caller
falls back to spawning) when it has more than one thread (``/proc/self/task``) or has initialised CUDA; on a host
with an NVIDIA driver there is no zygote at all (an import may initialise CUDA, which no fork survives). The environment the zygote
imported under is the services' environment (``OMP_NUM_THREADS``, ``HF_HUB_OFFLINE``, ... are read at import); a
request whose environment differs from it in any other variable than those read only when a service runs
(:data:`RUNTIME_ENV`: a learner rank's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...; ``FLEETRL_*`` settings) is
refused the same way; those are set (or unset) in the service before its module runs.

``FLEETRL_ZYGOTE=0`` turns it off: ``fleetrl run`` spawns every service as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

PRELOAD = (
    "torch", "numpy", "safetensors.torch", "tokenizers", "transformers", "transformers.modeling_utils",
    "transformers.masking_utils", "transformers.generation.utils", "torch.optim", "torch.distributed",
    "fastapi", "uvicorn", "httpx", "redis", "redis.asyncio",
    "services.reward.cli", "services.reward.app",
    "services.rollout.cli", "services.rollout.app", "services.rollout.service", "services.rollout.engines.hf.engine",
    "services.learner.cli", "services.learner.app", "services.learner.training.rl_trainer",
)
"""What every zygote imports before it forks anything (a module that fails to import is skipped and named in the
ready line: a service that needs it imports it, and fails, itself)."""

START_ENV = dict(os.environ)  # what the zygote was started with (an import may add to os.environ)
RUNTIME_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                         "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                         "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"})
"""Variables a service reads only when it runs, never at import (torch.distributed's rendezvous; the compile
caches, which torch itself writes into the environment of a process that touched them): a forked
service may differ from the zygote in these and in ``FLEETRL_*`` (pydantic-settings reads them when a service
builds its settings; nothing in shared/ or services/ reads the environment at import)."""
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
READY_TIMEOUT_S = 180.0


class ZygoteError(RuntimeError):
    """The zygote cannot start this service (or at all); the caller spawns it the ordinary way."""


class _BecomeService(BaseException):  # not an error: it unwinds a forked child to the top level
    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request


def runtime_overlay(base: dict[str, str], env: dict[str, str]) -> dict[str, str | None] | None:
    """What a service's environment ``env`` sets (a value) or unsets (None) over the zygote's ``base``, when every
    difference is in a variable read only at run time (:data:`RUNTIME_ENV`, ``FLEETRL_*`` but ``FLEETRL_ZYGOTE``);
    None when any other variable differs (the service must then be spawned)."""
    overlay: dict[str, str | None] = {}
    for key in base.keys() | env.keys():
        if base.get(key) == env.get(key):
            continue
        if key not in RUNTIME_ENV and not (key.startswith("FLEETRL_") and key != "FLEETRL_ZYGOTE"):
            return None
        overlay[key] = env.get(key)
    return overlay


def service_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a service process (and of the zygote that forks services)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), **(extra or {})}


def model_module(model: str | Path) -> str | None:
    """The transformers modeling module of a local model directory (``config.json``'s ``model_type``), or None."""
    try:
        model_type = json.loads((Path(model) / "config.json").read_text())["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    name = str(model_type).replace("-", "_")
    return f"transformers.models.{name}.modeling_{name}"


def subreaper(on: bool) -> bool:
    """Make this process the one that orphaned descendants are re-parented to (Linux), or stop being it (unless it
    was one before the first call). On only while the zygote forks a service (twice): the service is then this
    process's child (waitable, with its exit code), and other orphans of this process's descendants go to init as
    usual. False where that is not possible."""
    global _WAS_SUBREAPER
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        if _WAS_SUBREAPER is None:
            now = ctypes.c_int(0)
            if prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(now), 0, 0, 0) != 0:
                return False
            _WAS_SUBREAPER = bool(now.value)
        return prctl(PR_SET_CHILD_SUBREAPER, int(on or _WAS_SUBREAPER), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_WAS_SUBREAPER: bool | None = None


# ---- the launcher's side --------------------------------------------------------------------------------------
class ForkedProcess:
    """A service forked by the zygote and re-parented to this process: the part of ``subprocess.Popen`` the fleet
    uses (``pid``, ``returncode``, ``poll``, ``wait``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # not re-parented here (should not happen): alive while it exists
                    if not Path(f"/proc/{self.pid}").exists():
                        self.returncode = 255
                    return self.returncode
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.005)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The launcher's handle on a zygote process: :meth:`start` it early (it imports while the launcher checks the
    run), :meth:`fork` services from it, :meth:`close` it at the end."""

    def __init__(self, proc: subprocess.Popen, env: dict[str, str], log_path: Path) -> None:
        self.proc = proc
        self.env = env
        self.log_path = log_path
        self.ready: dict[str, Any] | None = None
        self.broken: str | None = None
        self._buf = b""
        self._asked = False  # a fork was requested (else close() need not wait for the zygote's answers)
        self._lock = threading.Lock()

    @classmethod
    def start(cls, env: dict[str, str], log_path: Path, extra: list[str] | tuple[str, ...] = (),
              preload: tuple[str, ...] = PRELOAD) -> Zygote | None:
        """Start a zygote that imports ``preload`` and ``extra`` under ``env`` (the services' environment); None
        where this process cannot adopt what it forks (not Linux), on a host with an NVIDIA driver (CUDA does not
        survive a fork once initialised, and an import may initialise it), or with ``FLEETRL_ZYGOTE=0``."""
        if os.environ.get("FLEETRL_ZYGOTE", "1") == "0" or shutil.which("nvidia-smi") or not subreaper(False):
            return None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "deploy.local.zygote", *preload, *extra], cwd=REPO,
                                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    start_new_session=True)
        return cls(proc, env, log_path)

    @classmethod
    def for_run(cls, model: str, run_dir: Path, threads: int = 1) -> Zygote | None:
        """The zygote of a ``fleetrl run``: the services' environment, its log ``run_dir/logs/zygote.log``, and the
        run's model class imported too."""
        return cls.start(service_env(threads), Path(run_dir) / "logs" / "zygote.log",
                         [m for m in [model_module(model)] if m])

    def fork(self, module: str, argv: list[str], log_path: Path, env: dict[str, str],
             timeout: float = READY_TIMEOUT_S, cwd: Path | None = None, err_path: Path | None = None) -> ForkedProcess:
        """``python -m module *argv`` forked from the zygote, in ``cwd`` (default the repository), its output
        appended to ``log_path`` (its stderr to ``err_path`` when given). Raises :class:`ZygoteError` when it
        cannot (the caller spawns the service instead)."""
        if runtime_overlay(self.env, env) is None:
            differ = sorted(k for k in self.env.keys() | env.keys() if self.env.get(k) != env.get(k)
                            and k not in RUNTIME_ENV and not (k.startswith("FLEETRL_") and k != "FLEETRL_ZYGOTE"))
            raise ZygoteError("the service's environment differs from the one the zygote imported under in "
                              + ", ".join(differ[:8]))
        with self._lock:
            if self.broken:
                raise ZygoteError(self.broken)
            try:
                if self.ready is None:
                    self.ready = self._read(timeout)
                    if "ready" not in self.ready:
                        raise ZygoteError(f"zygote did not start: {self.ready}")
                request = {"module": module, "argv": [str(a) for a in argv], "log": str(log_path),
                           "cwd": str(cwd or REPO), "env": env}
                if err_path is not None:
                    request["err"] = str(err_path)
                assert self.proc.stdin is not None
                self._asked = True
                subreaper(True)  # the zygote answers once the service is re-parented to this process
                try:
                    self.proc.stdin.write((json.dumps(request) + "\n").encode())
                    self.proc.stdin.flush()
                    reply = self._read(30.0)
                finally:
                    subreaper(False)
            except (OSError, ValueError, ZygoteError) as exc:
                self.broken = f"zygote unusable: {exc}"
                self.close()
                raise ZygoteError(self.broken) from exc
            if "pid" not in reply:
                raise ZygoteError(str(reply.get("error", reply)))
            return ForkedProcess(int(reply["pid"]), [sys.executable, "-m", module, *map(str, argv)])

    def _read(self, timeout: float) -> dict[str, Any]:
        """One JSON line from the zygote, within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ZygoteError(f"no answer within {timeout:.0f}s")
                if sel.select(left):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        raise ZygoteError(f"the zygote exited (code {self.proc.poll()}); log {self.log_path}")
                    self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        """End the zygote. The services it forked and handed out go on; one it forked for a request whose answer
        was never read (the caller interrupted, e.g. by Ctrl-C, while it waited) is stopped: nobody else knows
        of it."""
        if not self._asked and self.proc.poll() is None:  # it forked nothing (perhaps still importing): no wait
            self.proc.kill()
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for pid in self._unclaimed():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def _unclaimed(self) -> list[int]:
        """Pids in answers nobody read: what the zygote still says before it ends (stdin closed)."""
        if not self._asked or self.proc.stdout is None or self.proc.stdout.closed:
            return []
        pids = []
        with contextlib.suppress(OSError, ValueError, ZygoteError):
            while True:
                pids.append(int(self._read(5.0).get("pid", 0)))
        return [p for p in pids if p > 0]


# ---- the zygote's side -----------------------------------------------------------------------------------------
def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _preload(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    done, failed = [], {}
    for name in dict.fromkeys(modules):
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as exc:  # noqa: BLE001  (a preload is an optimisation: the service imports it itself)
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    return done, failed


def _serve(reply_fd: int) -> None:
    """Answer fork requests on stdin until EOF. Returns only in the parent; a forked service leaves by raising
    :class:`_BecomeService` up to :func:`main`'s caller."""
    out = os.fdopen(reply_fd, "w", buffering=1)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            overlay = runtime_overlay(START_ENV, request.get("env") or {})
            if overlay is None:
                raise ZygoteError("the service's environment differs from the one the zygote imported under")
            request["overlay"] = overlay
            if (n := _threads()) != 1:
                raise ZygoteError(f"the zygote has {n} threads; forking it is not safe")
            if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
                raise ZygoteError("the zygote has initialised CUDA; forking it is not safe")
            pid = _fork_service(request, out)
            _say(f"forked {' '.join([request['module'], *request['argv']])}: pid {pid}")
            out.write(json.dumps({"pid": pid}) + "\n")
        except ZygoteError as exc:
            out.write(json.dumps({"error": str(exc)}) + "\n")
        except (OSError, ValueError) as exc:
            out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")


def _fork_service(request: dict[str, Any], out: Any) -> int:
    """Fork twice: the middle process forks the service, writes its pid and exits, so the service is re-parented
    to the launcher (the subreaper). Returns the service's pid (in the zygote)."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the service, say its pid, leave
        try:
            os.close(r)
            service = os.fork()
        except BaseException:  # noqa: BLE001
            os._exit(1)
        if service == 0:
            os.close(w)
            out.close()
            raise _BecomeService(request)
        try:
            os.write(w, str(service).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        data = pipe.read()
    os.waitpid(middle, 0)
    if not data:
        raise ZygoteError("the fork failed")
    return int(data)


def _become(request: dict[str, Any]) -> None:
    """In the forked service: its session, files, signals and RNG as a fresh ``python -m`` would have them; then
    run its module as ``__main__`` (its exit is the interpreter's)."""
    import runpy

    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    err = os.open(request["err"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if request.get("err") else log
    os.dup2(log, 1)
    os.dup2(err, 2)
    os.close(log)
    if err != log:
        os.close(err)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (fd 0 is /dev/null now; the zygote's pipe is gone)
    os.chdir(request["cwd"])
    for key, value in request["overlay"].items():  # variables read only at run time (runtime_overlay)
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
        sys.modules["torch"].set_num_threads(int(threads))
    sys.argv = [request["module"], *request["argv"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _say(text: str) -> None:
    """A line of the zygote's log, stamped as the services' logging stamps theirs."""
    now = time.time()
    sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))},{int(now * 1000) % 1000:03d} "
                     f"INFO zygote: {text}\n")
    sys.stderr.flush()


def main(argv: list[str]) -> None:
    reply_fd = os.dup(1)  # the protocol; the zygote's own output (a preload's warnings) goes to its log
    os.dup2(2, 1)
    t0 = time.monotonic()
    _say(f"started (pid {os.getpid()}), importing {len(argv)} modules")
    done, failed = _preload(argv)
    _say(f"imported {len(done)} modules in {time.monotonic() - t0:.2f}s" +
         (f"; could not import {', '.join(failed)}" if failed else ""))
    with os.fdopen(os.dup(reply_fd), "w") as ready:
        ready.write(json.dumps({"ready": round(time.monotonic() - t0, 3), "preloaded": done, "failed": failed,
                                "threads": _threads()}) + "\n")
    _serve(reply_fd)
    _say("stdin closed: exiting")
    os._exit(0)  # nothing to flush or close: an interpreter's teardown of torch and transformers took seconds


if __name__ == "__main__":
    _request = None
    try:
        main(sys.argv[1:])
    except _BecomeService as become:  # a forked service: the zygote's frames are unwound; now run it
        _request = become.request
    if _request is not None:
        _become(_request)
