"""sglang-router 0.3.2 (its own Rust router, from PyPI) in front of two FleetRL rollout replicas, driven by SGLang
0.5.23's frontend: the program's single run, ``run_batch`` of 8 and streamed run are answered through the router
(which re-sends SGLang's whole request schema), and the router spreads them over both replicas."""

from __future__ import annotations

import json

import httpx
import pytest

from shared.ports import free_port
from tests.procs import run_module, spawn, starts_processes, stop, wait_http_ok
from tests.rollout.clients.sglang_frontend import PREFIX, QUESTIONS, STREAM_TOKENS
from tests.rollout.conftest import THREAD_ENV, start_rollouts

pytestmark = [pytest.mark.process, pytest.mark.slow]  # `import sglang` alone takes 20-60 s here


@pytest.fixture(scope="module")
@starts_processes
def routed(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang-router")
    config = {"model": str(tiny_model_dir), "served_model_name": "tiny",
              "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 16, "max_wait_ms": 2, "torch_threads": 1}}
    replicas = start_rollouts(tmp, {"replica-0": dict(config), "replica-1": dict(config)})
    port = free_port()
    log = tmp / "router.log"
    router = spawn(["-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port), "--policy",
                    "round_robin", "--worker-urls", *(url for _, url, _ in replicas)], log, env=THREAD_ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/health", router, timeout=120, log=log)
        yield url, [u for _, u, _ in replicas]
    finally:
        stop(router)
        for proc, _, _ in replicas:
            stop(proc)


def _generate_count(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("fleetrl_rollout_requests_total{") and 'route="/generate"' in line
               and 'status="200"' in line)


@pytest.mark.timeout(900)
def test_sglang_frontend_through_sglang_router_over_two_replicas(routed):
    url, replicas = routed
    before = [_generate_count(u) for u in replicas]
    # without sgl.select: it sends a batch of texts, which sglang-router's /generate refuses ("text: invalid type:
    # sequence, expected a string"); the router's limit, not the service's (select runs direct in test_sglang_frontend)
    proc = run_module(["-m", "tests.rollout.clients.sglang_frontend", url, "--no-select"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    direct = []
    for q in QUESTIONS:
        r = httpx.post(f"{replicas[0]}/generate", json={"text": PREFIX + q, "sampling_params": {
            "max_new_tokens": 4, "temperature": 0}}, timeout=60)
        assert r.status_code == 200, r.text
        direct.append(r.json()["text"])
    streamed = httpx.post(f"{replicas[0]}/generate", json={"text": PREFIX + QUESTIONS[0], "sampling_params": {
        "max_new_tokens": STREAM_TOKENS, "temperature": 0, "ignore_eos": True}}, timeout=60).json()["text"]
    assert out["single"] == direct[0] and out["batch"] == direct and out["stream"] == streamed
    served = [_generate_count(u) - b for u, b in zip(replicas, before)]
    assert all(n >= 1 for n in served), served  # round robin: both replicas answered the program's requests
