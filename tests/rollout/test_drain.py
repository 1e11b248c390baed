"""A replica leaving the pool (issue 30): ``POST /drain`` (control token) and SIGTERM. Real Redis, a real reward
service, two real rollout replicas. One drained with no time to finish hands its prompts back at once (another
replica takes them long before ``claim_idle_ms``, not counted as a delivery: ``prompts_max_deliveries: 1`` would
dead-letter them otherwise); the other, SIGTERMed, finishes what it holds before it exits. Every group is
generated exactly once, nothing is dead-lettered, and each replica deregisters from the weight registry."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from shared import keys
from shared.experience_queue import StreamQueue
from shared.schemas import PromptTask, sample_id
from shared.weight_sync.registry import ReplicaRegistry
from tests.rollout.conftest import CONTROL_TOKEN, start_rollouts
from tests.rollout.test_worker import read_experiences, reward_service, wait_for, worker_config  # noqa: F401

pytestmark = pytest.mark.process

CLAIM_IDLE_MS = 120_000  # far past the test: only a hand-back lets another replica take a prompt


async def _pending_on(redis_client, run: str) -> dict[str, int]:
    info = await redis_client.xpending(keys.prompts_stream(run), "rollout")
    return {(c["name"].decode() if isinstance(c["name"], bytes) else c["name"]): int(c["pending"])
            for c in info.get("consumers") or []}


async def test_drained_and_sigtermed_replicas_lose_nothing_and_repeat_nothing(redis_server, redis_client,
                                                                             tiny_model_dir, tmp_path, reward_service):  # noqa: F811
    run = "drain"
    common = {"claim_idle_ms": CLAIM_IDLE_MS, "prompts_max_deliveries": 1, "drain_timeout_s": 120.0,
              "sampling": {"max_new_tokens": 400, "temperature": 1.0, "ignore_eos": True}}
    configs = {name: {**worker_config(tiny_model_dir, redis_server.url, run, reward_service, consumer_name=name,
                                      concurrency=conc, **common), "control_token": CONTROL_TOKEN}
               for name, conc in (("leaver", 2), ("stayer", 1))}
    (proc_a, url_a, _), (proc_b, _, log_b) = start_rollouts(tmp_path, configs)
    registry = ReplicaRegistry(redis_client, run)
    auth = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
    try:
        assert len(await registry.alive()) == 2
        prompts = StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask)
        tasks = [PromptTask(id=f"g{i}", prompt=f"tell {i}", n=3) for i in range(3)]
        await prompts.produce(tasks)

        async def both_busy():
            held = await _pending_on(redis_client, run)
            return held.get("leaver", 0) == 2 and held.get("stayer", 0) == 1

        await wait_for(both_busy, 60, "the leaver to take two prompts and the stayer one")
        async with httpx.AsyncClient(timeout=10) as c:
            assert (await c.post(f"{url_a}/drain")).status_code == 401  # a control route
            bad = await c.post(f"{url_a}/drain", json={"timeout_s": -1}, headers=auth)
            assert bad.status_code == 400 and "timeout_s" in bad.text
            t0 = time.monotonic()
            r = await c.post(f"{url_a}/drain", json={"timeout_s": 0}, headers=auth)  # no time: hand everything back
            assert r.status_code == 202 and r.json()["draining"] is True
        await asyncio.to_thread(proc_a.wait, 60)
        assert proc_a.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it shut down on
        assert time.monotonic() - t0 < 30
        assert len(await registry.alive()) == 1, "the drained replica must deregister"

        async def stayer_on_a_handed_back_one():  # its own group done, one of the leaver's in progress
            return await redis_client.xlen(keys.prompts_stream(run)) == 2 and \
                (await _pending_on(redis_client, run)).get("stayer", 0) == 1

        await wait_for(stayer_on_a_handed_back_one, 60, "the stayer to take a handed-back prompt")
        os.killpg(proc_b.pid, signal.SIGTERM)  # leaves too, with time to finish what it holds
        await asyncio.to_thread(proc_b.wait, 120)
        assert proc_b.returncode in (0, -signal.SIGTERM), log_b.read_text()[-2000:]
        assert "1 finished, 0 handed back" in log_b.read_text(), "the SIGTERMed replica finishes what it holds"
        assert await registry.alive() == []
        assert await redis_client.xlen(keys.dead_letter_stream(keys.prompts_stream(run))) == 0
        # the prompt nobody finished is still there, and a newcomer takes it at once, as its first delivery; unless
        # the stayer finished its handed-back group before the SIGTERM came and took that one too (a quick machine):
        # then every group is done, each exactly once (checked below: a prompt lost on the way has no samples)
        newcomer = StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask,
                               claim_idle_ms=CLAIM_IDLE_MS)
        rest = await newcomer.consume("newcomer", count=3, block_ms=10)
        assert len(rest) <= 1 and all(r.deliveries == 1 for r in rest)
        assert time.monotonic() - t0 < CLAIM_IDLE_MS / 1000, "nothing may have waited for claim_idle_ms"
        exps = await read_experiences(redis_client, run)
        done = [t for t in tasks if t.id not in {r.record.id for r in rest}]
        assert sorted(e.id for e in exps) == sorted(sample_id(t.id, i) for t in done for i in range(3)), \
            "each finished group generated exactly once, nothing of the unfinished one"
    finally:
        for p in (proc_a, proc_b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
