"""Helpers for weight-sync tests: real rollout service processes (hf engine, tiny model) with the weight
sidecar, a publisher in the test process, and reference weights."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

import httpx
import pytest

from shared.ports import free_port
from tests.procs import kill9, spawn, starts_processes, stop, wait_http_ok

TOKEN = "weights-test-token"
PROMPT = "The quick brown fox"


@pytest.fixture()
async def threads():
    """Publisher and replicas block in threads of one loop: more workers than the default 2-core pool."""
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(16)
    loop.set_default_executor(pool)
    yield
    pool.shutdown(wait=False)


@dataclass
class Replica:
    url: str
    proc: Popen
    log: Path

    def generate(self, text: str = PROMPT, max_new_tokens: int = 12) -> dict:
        r = httpx.post(f"{self.url}/generate", timeout=60, json={
            "text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0,
                                              "ignore_eos": True}})
        assert r.status_code == 200, r.text
        return r.json()

    def weight_version(self) -> int:
        return int(httpx.get(f"{self.url}/model_info", timeout=10).json()["weight_version"])

    def weights_status(self) -> dict:
        r = httpx.get(f"{self.url}/weights/version", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture()
@starts_processes
def replicas(tmp_path, redis_server, tiny_model_dir):
    """Factory: ``start(run, **sidecar_env)`` launches one rollout service process; all stopped at the end."""
    started: list[Replica] = []

    def start(run: str, wait: bool = True, **sidecar_env: str) -> Replica:
        port = free_port()
        log = tmp_path / f"rollout-{port}.log"
        env = {
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "FLEETRL_ROLLOUT_WEIGHT_SIDECAR": "true",
            "FLEETRL_ROLLOUT_CONTROL_TOKEN": TOKEN,
            "FLEETRL_ROLLOUT_WEIGHTS__HEARTBEAT_S": "0.3", "FLEETRL_ROLLOUT_WEIGHTS__HEARTBEAT_TTL_S": "2",
            **{f"FLEETRL_ROLLOUT_WEIGHTS__{k.upper()}": v for k, v in sidecar_env.items()},
        }
        proc = spawn(["-m", "services.rollout", "--model", str(tiny_model_dir), "--port", str(port),
                      "--engine", "hf", "--device", "cpu", "--redis-url", redis_server.url, "--run-name", run], log, env)
        rep = Replica(f"http://127.0.0.1:{port}", proc, log)
        started.append(rep)
        if wait:
            wait_http_ok(f"{rep.url}/health", proc, timeout=120, log=log)
        return rep

    def start_all(run: str, n: int, **sidecar_env: str) -> list[Replica]:
        """``n`` replicas started side by side (faster than one after another)."""
        reps = [start(run, wait=False, **sidecar_env) for _ in range(n)]
        for rep in reps:
            wait_http_ok(f"{rep.url}/health", rep.proc, timeout=120, log=rep.log)
        return reps

    start.all = start_all
    try:
        yield start
    finally:
        for rep in started:  # every one, even if stopping another failed
            try:
                stop(rep.proc)
            except Exception:  # noqa: BLE001 - whatever went wrong, the process must not outlive the test
                kill9(rep.proc)


async def wait_ready(rep: Replica, timeout: float = 120) -> None:
    await asyncio.to_thread(wait_http_ok, f"{rep.url}/health", rep.proc, timeout, rep.log)


async def wait_registered(redis, run: str, n: int, timeout: float = 30) -> list:
    from shared.weight_sync.registry import ReplicaRegistry

    reg = ReplicaRegistry(redis, run)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        alive = await reg.alive()
        if len(alive) >= n:
            return alive
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{len(alive)} of {n} replicas registered")
        await asyncio.sleep(0.1)


async def wait_alive(pub, n: int, timeout: float = 10.0) -> None:
    """Until exactly ``n`` replicas are alive in ``pub``'s registry (a publisher-side wait: replicas joining, or
    one leaving)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while len(await pub.registry.alive()) != n:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{n} replicas never alive (now {len(await pub.registry.alive())})")
        await asyncio.sleep(0.05)


def new_weights(model_dir: Path, seed: int = 1):
    """The tiny model with every tensor perturbed (deterministically): the 'trained' policy."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return model


def reference_ids(model, tokenizer_dir: Path, text: str = PROMPT, max_new_tokens: int = 12) -> list[int]:
    """Greedy generation from a model loaded directly with the given weights."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


os.environ.setdefault("OMP_NUM_THREADS", "1")
