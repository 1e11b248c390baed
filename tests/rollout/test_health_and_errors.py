"""``/health`` under a saturated engine, ``/health_generate``, and a 500 that keeps the connection (real process).

Issue 17 #7: the hf engine's ``/health`` queued a one-token probe behind the whole backlog, so a busy replica
failed its liveness probe. Issue 17 #5: after a 500 the server dropped the keep-alive connection and the
client's next request on it failed.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.procs import starts_processes, stop
from tests.rollout.conftest import start_rollout

MAX_INFLIGHT = 200
HEALTH_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
@starts_processes
def server(tiny_model_dir, tmp_path_factory):
    """4 sequences decoded at a time, so a full admission queue takes minutes to drain."""
    config = {
        "model": str(tiny_model_dir),
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 4, "max_wait_ms": 1, "torch_threads": 1,
                   "health_timeout_s": HEALTH_TIMEOUT_S},
        "limits": {"max_inflight_sequences": MAX_INFLIGHT},
        "extensions": ["tests.rollout.faulty_routes:faulty_router"],
    }
    proc, url, _ = start_rollout(tmp_path_factory.mktemp("health"), "health", config)
    yield url
    stop(proc)


def gauge(text: str, name: str) -> float:
    return next(float(ln.split()[1]) for ln in text.splitlines() if ln.startswith(name + " "))


async def test_health_answers_at_once_while_the_engine_is_saturated(server):
    long = {"text": "fill the engine", "sampling_params": {"max_new_tokens": 450, "ignore_eos": True, "n": 10}}
    async with httpx.AsyncClient(base_url=server, timeout=300, limits=httpx.Limits(max_connections=40)) as c:
        load = [asyncio.create_task(c.post("/generate", json=long)) for _ in range(MAX_INFLIGHT // 10)]
        for _ in range(100):
            metrics = (await c.get("/metrics")).text
            if gauge(metrics, "fleetrl_rollout_inflight_sequences") == MAX_INFLIGHT:
                break
            await asyncio.sleep(0.1)
        assert gauge(metrics, "fleetrl_rollout_queue_depth") > 100, "the engine is not saturated"
        for _ in range(5):
            started = time.monotonic()
            r = await c.get("/health")
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            assert time.monotonic() - started < 1.0
            await asyncio.sleep(0.2)
        # readiness: a real generation through the queue cannot finish in time behind this backlog
        started = time.monotonic()
        assert (await c.get("/health_generate")).status_code == 503
        assert time.monotonic() - started < HEALTH_TIMEOUT_S + 2
        assert sum(not t.done() for t in load) > 10  # still saturated
        for t in load:  # the clients go away: their sequences are aborted
            t.cancel()
        await asyncio.gather(*load, return_exceptions=True)
    async with httpx.AsyncClient(base_url=server, timeout=60) as c:
        for _ in range(100):
            if gauge((await c.get("/metrics")).text, "fleetrl_rollout_inflight_sequences") == 0:
                break
            await asyncio.sleep(0.1)
        assert (await c.get("/health_generate")).status_code == 200
        assert (await c.get("/health")).status_code == 200


def test_a_500_is_json_and_keeps_the_connection(server):
    with httpx.Client(base_url=server, timeout=30) as c:
        port = c.get("/test/connection").json()["client_port"]
        r = c.get("/test/raise")
        assert r.status_code == 500
        assert r.json() == {"error": {"message": "internal error: RuntimeError", "type": "internal_error", "code": 500},
                            "detail": "internal error: RuntimeError"}
        again = c.get("/test/connection")  # before the fix: httpx.ReadError (connection reset)
        assert again.status_code == 200 and again.json()["client_port"] == port
        assert c.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
