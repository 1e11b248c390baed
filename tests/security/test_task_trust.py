"""Prompt tasks that can never succeed, against a real rollout worker process (the built-in ``single_turn``, signed
records, a real reward service) and a real Redis: each is dead-lettered at its first delivery with its reason,
its lease acknowledged, never redelivered, while the good tasks around it become experiences; and a prompt that
takes seconds to tokenise is tokenised off the event loop, so ``/health`` keeps answering meanwhile.

The worker's ``claim_idle_ms`` is short (200 ms) and ``prompts_max_deliveries`` the default 5, so a task failed
as an ordinary (transient) failure would be redelivered within the test's wait and dead-lettered only at its
fifth delivery ("failed 5 times: ...")."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis.asyncio as aioredis

from shared import keys
from shared.codec import decode
from shared.experience_queue import PERMANENT, StreamQueue
from shared.ports import free_port
from shared.schemas import Experience, PromptTask, sample_id
from shared.signing import signer_for
from tests.procs import stop
from tests.rollout.conftest import start_rollout
from tests.rollout.test_worker import start_reward

pytestmark = pytest.mark.process

RUN = "task-trust"
RUN_KEY = "task-trust-run-key-0123456789"
MAX_PROMPT_CHARS = 2_000_000  # well past the tiny model's context (512), so a huge prompt is tokenised, then refused
HUGE_CHARS = 1_500_000  # seconds of tokenising on this machine (byte-level: one token per character)
HEALTH_S = 2.0


@pytest.fixture(scope="module")
def worker(tiny_model_dir, redis_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("task-trust")
    reward_port = free_port()
    reward = start_reward(tmp, reward_port)
    cfg = {"model": str(tiny_model_dir), "redis_url": redis_server.url, "run_name": RUN, "run_key": RUN_KEY,
           "weight_sidecar": False, "engine": {"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
           "worker": {"enabled": True, "reward_url": f"http://127.0.0.1:{reward_port}", "concurrency": 4,
                      "poll_interval_s": 0.1, "max_prompt_chars": MAX_PROMPT_CHARS,
                      "sampling": {"max_new_tokens": 4}}, "run": {"prompt_claim_idle_ms": 200}}
    proc, url, _ = start_rollout(tmp, "worker", cfg)
    yield url
    stop(proc)
    stop(reward)


async def produce(url: str, tasks: list[PromptTask]) -> None:
    client = aioredis.from_url(url)
    try:
        await StreamQueue(client, keys.prompts_stream(RUN), "rollout", PromptTask, signer=signer_for(RUN_KEY),
                          max_backlog=64).produce(tasks)
    finally:
        await client.aclose()


async def settled(client, timeout: float = 120.0) -> None:
    """Every prompt acknowledged or dead-lettered (both delete it from the prompts stream)."""
    deadline = time.monotonic() + timeout
    while await client.xlen(keys.prompts_stream(RUN)):
        assert time.monotonic() < deadline, "the worker did not settle every prompt"
        await asyncio.sleep(0.1)


async def dead_letters(client) -> dict[str, dict[str, str]]:
    """The prompts' dead letters by task id: error and deliveries."""
    out = {}
    for _, f in await client.xrange(keys.dead_letter_stream(keys.prompts_stream(RUN))):
        task = decode(f[b"payload"], expect=PromptTask)
        out[task.id] = {"error": f[b"error"].decode(), "deliveries": f.get(b"deliveries", b"?").decode()}
    return out


async def experiences(client) -> list[Experience]:
    q = StreamQueue(client, keys.experiences_stream(RUN), "learner", Experience, signer=signer_for(RUN_KEY))
    out = []
    while ds := await q.consume("test-learner", count=100, block_ms=100):
        out.extend(d.record for d in ds)
        await q.ack([d.id for d in ds])
    return out


async def test_a_task_that_can_never_succeed_is_dead_lettered_at_its_first_delivery(worker, redis_server):
    bad = [
        PromptTask(id="bad-ids", prompt_token_ids=[72, 10**6], n=2),  # outside the vocabulary
        PromptTask(id="bad-long-ids", prompt_token_ids=[72] * 600, n=2),  # past the context (512)
        PromptTask(id="bad-chars", prompt="a" * (MAX_PROMPT_CHARS + 1), n=2),  # past worker.max_prompt_chars
        PromptTask(id="bad-stops", prompt="say a", n=2, sampling={"stop": [f"s{i}" for i in range(100)]}),
    ]
    good = [PromptTask(id=f"good-{i}", prompt=f"say a {i}", n=2, label="a") for i in range(3)]
    await produce(redis_server.url, [good[0], *bad[:2], good[1], *bad[2:], good[2]])
    client = aioredis.from_url(redis_server.url)
    try:
        await settled(client)
        await asyncio.sleep(1.0)  # several claim_idle_ms: a redelivery would show now
        dead = await dead_letters(client)
        assert sorted(dead) == sorted(t.id for t in bad), dead
        for task_id, d in dead.items():
            assert d["error"].startswith(f"{PERMANENT}bad prompt task: "), (task_id, d)
            assert d["deliveries"] == "1", (task_id, d)  # dead-lettered at the first delivery, not the fifth
        assert "outside the vocabulary" in dead["bad-ids"]["error"]
        assert "worker.max_prompt_chars" in dead["bad-chars"]["error"]
        assert "limits.max_stop_strings" in dead["bad-stops"]["error"]
        exps = await experiences(client)
        assert sorted(e.id for e in exps) == sorted(sample_id(t.id, i) for t in good for i in range(2))
        assert await client.xlen(keys.prompts_stream(RUN)) == 0  # every lease acknowledged: nothing pending
    finally:
        await client.aclose()


def test_health_answers_while_a_huge_prompt_is_tokenised(worker, redis_server):
    huge = PromptTask(id="huge", prompt="ab cd " * (HUGE_CHARS // 6), n=1)
    asyncio.run(produce(redis_server.url, [huge]))
    started = time.monotonic()
    answered: list[float] = []

    async def refused() -> bool:
        client = aioredis.from_url(redis_server.url)
        try:
            return "huge" in await dead_letters(client)
        finally:
            await client.aclose()

    with ThreadPoolExecutor(1) as pool:
        while not pool.submit(asyncio.run, refused()).result():
            assert time.monotonic() - started < 120, "the huge prompt was never refused"
            t0 = time.monotonic()
            assert httpx.get(f"{worker}/health", timeout=HEALTH_S + 1).status_code == 200
            answered.append(time.monotonic() - t0)
            time.sleep(0.1)
    took = time.monotonic() - started
    # polled while it was tokenised (twice at least: a clean clone's run tokenised it in 2.0 s with each probe
    # taking 0.7-0.8 s, and >= 3 failed there)
    assert len(answered) >= 2 and max(answered) < HEALTH_S, (took, answered)

    async def reason() -> dict:
        client = aioredis.from_url(redis_server.url)
        try:
            return (await dead_letters(client))["huge"]
        finally:
            await client.aclose()

    d = asyncio.run(reason())
    assert d["deliveries"] == "1" and "context length" in d["error"], d
