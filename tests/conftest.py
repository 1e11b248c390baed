"""Fixtures shared by every test: a private Redis server, tiny models, process helpers; the test tiers.

Tiers (markers in pyproject.toml): ``process`` tests start service processes or other Python processes (each
costs seconds of imports and model loading), ``slow`` ones take more than ~30 s; ``make test-fast`` runs the
rest. A test gets ``process`` from its own marker or from a fixture put under ``@starts_processes``
(tests/procs.py). Under ``make test-fast`` (``FLEETRL_TEST_TIER=fast``) a test that starts a Python process
without the marker fails, naming it, so the fast tier stays fast and the markers stay honest.
"""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.redis_server import EmbeddedRedis

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> EmbeddedRedis:
    """A private redis-server on a free port for the whole session (never the shared :6379)."""
    server = EmbeddedRedis(data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture()
async def redis_client(redis_server):
    """An asyncio client on a clean database (FLUSHALL before each test)."""
    client = aioredis.from_url(redis_server.url, socket_timeout=10, socket_connect_timeout=5)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Llama-shaped causal LM with a byte-level tokenizer, in Hugging Face format."""
    from deploy.local.tiny_model import build_tiny_causal_lm

    return build_tiny_causal_lm(tmp_path_factory.mktemp("tiny-lm"))


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory) -> Path:
    """A tiny sequence-classification reward model in Hugging Face format."""
    from deploy.local.tiny_model import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny-rm"))


BENCHMARKS = Path(__file__).resolve().parent / "benchmarks"


def pytest_collection_modifyitems(config, items) -> None:
    """Every test under tests/benchmarks is a ``bench`` test (a benchmark script's quick run: ``make test-bench``).
    Every test that uses a fixture marked ``@starts_processes`` (directly or through another) is a ``process`` test."""
    for item in items:
        if BENCHMARKS in Path(item.path).parents:
            item.add_marker(pytest.mark.bench)
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(getattr(d.func, "starts_processes", False) for defs in info.name2fixturedefs.values() for d in defs):
            item.add_marker(pytest.mark.process)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _longest_files_first(items)


def _cost(item) -> float:
    """A rough guess of a test's seconds from its tier (slow ~30-90 s, process ~3-10 s, the rest well under 1 s)."""
    return 40.0 if item.get_closest_marker("slow") else 5.0 if item.get_closest_marker("process") else 0.1


def _longest_files_first(items) -> None:
    """Under pytest-xdist (``make test``: ``--dist loadfile --no-loadscope-reorder``) the files are handed to the
    workers in collection order, so the costliest ones go first and no long file is left alone at the end.
    The order inside a file is kept; every worker computes the same order, as xdist requires."""
    cost: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        cost[path] = cost.get(path, 0.0) + _cost(item)
    first = {path: i for i, path in reversed(list(enumerate(item.nodeid.split("::", 1)[0] for item in items)))}
    items.sort(key=lambda it: (-cost[it.nodeid.split("::", 1)[0]], first[it.nodeid.split("::", 1)[0]]))


def _is_python(argv) -> bool:
    first = argv if isinstance(argv, (str, bytes)) else (argv[0] if argv else "")
    first = os.fsdecode(first).split()[0] if first else ""
    return first == sys.executable or os.path.basename(first).startswith("python")


_started: list[str] = []  # Python processes started since the current test's setup began (fast tier only)


def pytest_configure(config) -> None:
    """Under ``make test-fast``, note every Python process a test (or a fixture it sets up, of any scope) starts.
    With ``PYTEST_CPU_LOG=PATH``, write each fresh Python interpreter a test starts (not one forked from the
    zygote: ``tests/procs.py``) to ``PATH.spawns.<worker>``, naming the test."""
    cpu_log = os.environ.get("PYTEST_CPU_LOG")
    fast = os.environ.get("FLEETRL_TEST_TIER") == "fast"
    if not (cpu_log or fast):
        return
    spawns = f"{cpu_log}.spawns.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}" if cpu_log else None
    popen_init = subprocess.Popen.__init__

    def watched_popen(self, args, *a, **kw):
        if _is_python(args):
            line = str(args if isinstance(args, (str, bytes)) else " ".join(map(str, args)))
            if fast:
                _started.append(line[:120])
            if spawns:
                with open(spawns, "a") as log:
                    log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{line[:200]}\n")
        return popen_init(self, args, *a, **kw)

    subprocess.Popen.__init__ = watched_popen
    if fast:
        spawnv_passfds = multiprocessing.util.spawnv_passfds

        def watched_spawn(path, args, passfds):
            _started.append(f"multiprocessing child: {' '.join(map(str, args))[:100]}")
            return spawnv_passfds(path, args, passfds)

        multiprocessing.util.spawnv_passfds = watched_spawn


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _started.clear()  # before any fixture of this test is set up, module- and session-scoped ones included
    yield


@pytest.fixture(scope="module", autouse=True)
def _environment_put_back():
    """A test module leaves ``os.environ`` as it found it. Libraries write into it (``ray.init``: RAY_AUTH_MODE,
    RAY_USAGE_STATS_ENABLED, PYTHONBREAKPOINT; torch's compile cache), and a variable left behind made every later
    service of the worker differ from the test zygote's environment, so each was started afresh instead of forked
    (tests/procs.py; ~50 services in one ``make test``, ~3 CPU-seconds each)."""
    before = dict(os.environ)
    yield
    for key in [k for k in os.environ if k not in before]:
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


_BUILTIN = ("services.", "shared.")  # kinds the product registers when its modules are first imported


@pytest.fixture(autouse=True)
def _plugin_registries_put_back():
    """A kind a test registers (or replaces) is gone after it: the plug-in registries are process-wide, and a
    kind left behind changed what later tests in the same process saw (CI: the benchmark's ``sleep`` engine,
    registered by tests/deploy/test_sleep_engine.py, showed up in tests/rollout/engines/test_weight_sinks.py).
    Builtin kinds registered by a product module imported during the test stay: the module stays imported."""
    from shared.plugins import POINTS

    before = {name: dict(point._entries) for name, point in POINTS.items()}
    yield
    for name, point in list(POINTS.items()):
        old = before.get(name, {})
        for kind, entry in list(point._entries.items()):
            if kind in old:
                if entry is not old[kind]:
                    point.register(kind, old[kind].settings, old[kind].impl, doc=old[kind].doc, replace=True)
            elif not entry.impl_path.startswith(_BUILTIN):
                point.unregister(kind)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_python_process(request):
    """Under ``make test-fast``: fail a test that started a Python process but is not marked ``process``."""
    yield
    if _started and not request.node.get_closest_marker("process"):
        pytest.fail(f"{request.node.nodeid} started a Python process ({_started[0]}) but is in the fast tier: mark it "
                    "@pytest.mark.process (or put the fixture that starts it under @starts_processes, tests/procs.py)",
                    pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``PYTEST_CPU_LOG=PATH``: one JSON line per test in ``PATH.<worker>``: its wall seconds and the
    CPU seconds it cost (this process and every descendant reaped during it: the services a test starts are
    re-parented to the worker and reaped by it), to find what makes the suite slow on a 2-core machine
    (docs/testing.md, "Where the suite's time goes")."""
    path = os.environ.get("PYTEST_CPU_LOG")
    if not path:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    t0, c0 = time.monotonic(), cpu()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{path}.{worker}", "a") as log:
        log.write(json.dumps({"test": item.nodeid, "wall": round(time.monotonic() - t0, 3),
                              "cpu": round(cpu() - c0, 3)}) + "\n")
