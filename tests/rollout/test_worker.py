"""The rollout worker against a real Redis and a real reward service process: prompts become acknowledged
experiences; the reward service being down delays (never invents) rewards; staleness holds the worker
back; a worker SIGKILLed mid-group loses no prompt."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import yaml

from shared import keys
from shared.experience_queue import StreamQueue
from shared.ports import free_port
from shared.schemas import Experience, PromptTask, SamplingOverrides, SamplingRecord, sample_id
from tests.procs import kill9, spawn, starts_processes, stop, wait_http_ok
from tests.rollout.conftest import THREAD_ENV, start_rollout, start_rollouts

pytestmark = pytest.mark.process  # reward service processes

REWARD_CONFIG = {"scorers": [{"name": "has_a", "kind": "rule", "check": {"type": "format", "pattern": "a"}}]}


def start_reward(tmp, port: int):
    cfg = tmp / "reward.yaml"
    cfg.write_text(yaml.safe_dump({**REWARD_CONFIG, "port": port}))
    log = tmp / f"reward-{time.monotonic_ns()}.log"
    proc = spawn(["-m", "services.reward", "--config", str(cfg)], log, env=THREAD_ENV)
    wait_http_ok(f"http://127.0.0.1:{port}/health", proc, timeout=60, log=log)
    return proc


def worker_config(model_dir, redis_url: str, run: str, reward_port: int, **worker) -> dict:
    """The worker's own settings from ``worker``; its run-wide ones (max_staleness, claim_idle_ms: the prompts')
    go to the ``run`` section."""
    run_wide = {field: worker.pop(name) for name, field in (("max_staleness", "max_staleness"),
                                                           ("claim_idle_ms", "prompt_claim_idle_ms")) if name in worker}
    return {
        "model": str(model_dir), "redis_url": redis_url, "run_name": run, "run": run_wide,
        "engine": {"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
        "worker": {"enabled": True, "reward_url": f"http://127.0.0.1:{reward_port}", "concurrency": 4,
                   "poll_interval_s": 0.2, "reward_backoff_max_s": 0.5,
                   "sampling": {"max_new_tokens": 6, "temperature": 1.0}, **worker},
    }


async def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def read_experiences(redis_client, run: str) -> list[Experience]:
    q = StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience)
    out = []
    while True:
        ds = await q.consume("test-learner", count=100, block_ms=100)
        if not ds:
            return out
        out.extend(d.record for d in ds)
        await q.ack([d.id for d in ds])  # as the learner does once it holds them


async def test_prompts_become_acked_experiences(redis_server, redis_client, tiny_model_dir, tmp_path):
    run = "worker-e2e"
    reward_port = free_port()
    cfg = worker_config(tiny_model_dir, redis_server.url, run, reward_port, max_staleness=1)
    rollout_proc, url, _ = start_rollout(tmp_path, "worker", cfg)
    reward_proc = None
    try:
        prompts = StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask)
        tasks = [PromptTask(id=f"t{i}", prompt=f"say a {i}", n=3, label="a", metadata={"k": i}) for i in range(3)]
        tasks.append(PromptTask(id="ids", prompt_token_ids=[72, 105], n=2, sampling=SamplingOverrides(max_new_tokens=4)))
        tasks.append(PromptTask(id="chat", prompt=[{"role": "user", "content": "hi"}], n=2))
        await prompts.produce(tasks)
        # the reward service is down: the worker generates, then waits; no experience, no ack
        await asyncio.sleep(2.5)
        assert await redis_client.xlen(keys.experiences_stream(run)) == 0
        assert await _unacked(redis_client, run) == len(tasks)
        async with httpx.AsyncClient() as c:
            metrics = (await c.get(f"{url}/metrics", timeout=10)).text
        assert "fleetrl_rollout_worker_reward_retries_total" in metrics
        reward_proc = start_reward(tmp_path, reward_port)

        async def all_pushed():
            return await redis_client.xlen(keys.experiences_stream(run)) >= 13

        await wait_for(all_pushed, 60, "13 experiences")
        await wait_for(lambda: _zero(prompts), 10, "all prompts acked")
        exps = await read_experiences(redis_client, run)
        by_id = {e.id: e for e in exps}
        assert len(by_id) == 13
        for t in tasks:
            group = [by_id[sample_id(t.id, i)] for i in range(t.n)]
            assert all(e.group_id == t.id and e.group_size == t.n and e.prompt_id == t.id for e in group)
            assert [e.index for e in group] == list(range(t.n))
            for e in group:
                assert len(e.response_logprobs) == len(e.response_token_ids) >= 1
                assert all(lp <= 0 for lp in e.response_logprobs)
                assert e.weight_version == 0 and e.finish_reason in ("stop", "length")
                assert e.reward == (1.0 if "a" in e.response_text else 0.0)  # the real reward service's rule
                assert e.reward_components == {"has_a": e.reward}
                assert e.label == t.label and e.metadata == t.metadata
                # the sampling contract: how it was sampled, and by which version
                assert e.sampling == SamplingRecord(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0,
                                                    max_tokens=t.sampling.max_new_tokens or 6)
                assert e.version_spans == [(0, 0)]
        assert by_id["ids#0"].prompt_token_ids == [72, 105] and len(by_id["ids#0"].response_token_ids) <= 4
        assert by_id["chat#0"].prompt_token_ids[0] == 3  # <|im_start|> from the chat template

        # staleness: the learner is 5 versions ahead, the replica at 0, max_staleness 1 -> hold back
        await redis_client.set(keys.weights_version(run), 5)
        await asyncio.sleep(1.0)  # the worker checks before each (0.5 s) blocking read
        await prompts.produce(PromptTask(id="late", prompt="wait for me", n=1))
        await asyncio.sleep(2.0)
        assert await prompts.backlog() == 1  # not even taken
        assert await redis_client.xlen(keys.experiences_stream(run)) == 0  # nothing new was generated
        await redis_client.set(keys.weights_version(run), 1)
        await wait_for(lambda: _zero(prompts), 30, "the held-back prompt")
        late = await read_experiences(redis_client, run)
        assert [e.id for e in late] == ["late#0"]
    finally:
        stop(rollout_proc)
        if reward_proc is not None:
            stop(reward_proc)


async def _zero(q: StreamQueue) -> bool:
    """Every prompt acknowledged (acked entries are deleted from the stream)."""
    return await q.redis.xlen(q.stream) == 0


async def _unacked(redis_client, run: str) -> int:
    return await redis_client.xlen(keys.prompts_stream(run))


@pytest.fixture()
@starts_processes
def reward_service(tmp_path):
    port = free_port()
    proc = start_reward(tmp_path, port)
    yield port
    stop(proc)


async def test_sigkilled_worker_loses_no_prompt(redis_server, redis_client, tiny_model_dir, tmp_path, reward_service):
    run = "worker-kill"
    slow = {"claim_idle_ms": 1500, "sampling": {"max_new_tokens": 400, "temperature": 1.0, "ignore_eos": True}}
    cfg_a = worker_config(tiny_model_dir, redis_server.url, run, reward_service, consumer_name="worker-a", **slow)
    proc_a, _, _ = start_rollout(tmp_path, "worker-a", cfg_a)
    prompts = StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask)
    task = PromptTask(id="victim", prompt="long story", n=8)
    try:
        await prompts.produce(task)

        async def pending_on_a():
            info = await redis_client.xpending(keys.prompts_stream(run), "rollout")
            return any(c["name"] in (b"worker-a", "worker-a") for c in info.get("consumers", []))

        await wait_for(pending_on_a, 30, "worker A to take the prompt")
        await asyncio.sleep(0.2)
        assert await redis_client.xlen(keys.experiences_stream(run)) == 0  # mid-group
    finally:
        kill9(proc_a)
    assert await _unacked(redis_client, run) == 1  # still pending on the dead worker, not lost
    cfg_b = worker_config(tiny_model_dir, redis_server.url, run, reward_service, consumer_name="worker-b",
                          claim_idle_ms=1500, sampling={"max_new_tokens": 8})
    proc_b, _, _ = start_rollout(tmp_path, "worker-b", cfg_b)
    try:
        await wait_for(lambda: _zero(prompts), 60, "worker B to reclaim and finish the prompt")
        exps = await read_experiences(redis_client, run)
        assert sorted(e.id for e in exps) == sorted(sample_id("victim", i) for i in range(8))
        assert all(e.group_size == 8 for e in exps)
    finally:
        stop(proc_b)


async def test_groups_longer_than_claim_idle_are_not_taken_from_live_workers(redis_server, redis_client,
                                                                             tiny_model_dir, tmp_path):
    """Scoring takes five times claim_idle_ms. The workers holding the prompts are alive, so nobody may
    reclaim them: every group is generated exactly once and nothing is dead-lettered."""
    run = "worker-lease"
    reward_port = free_port()
    cfg = tmp_path / "slow-reward.yaml"
    cfg.write_text(yaml.safe_dump({"port": reward_port, "scorers": [
        {"name": "slow", "kind": "python", "function": "tests.reward.plugins:verl_slow_async", "signature": "verl",
         "max_workers": 64}]}))
    reward_proc = spawn(["-m", "services.reward", "--config", str(cfg)], tmp_path / "slow-reward.log", env=THREAD_ENV)
    procs = []
    try:
        workers = {name: worker_config(tiny_model_dir, redis_server.url, run, reward_port, consumer_name=name,
                                       claim_idle_ms=400, concurrency=2, prompts_max_deliveries=2)
                   for name in ("lease-a", "lease-b")}
        procs = [proc for proc, _, _ in start_rollouts(tmp_path, workers)]  # side by side with the reward's start
        wait_http_ok(f"http://127.0.0.1:{reward_port}/health", reward_proc, timeout=60, log=tmp_path / "slow-reward.log")
        prompts = StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask)
        tasks = [PromptTask(id=f"long{i}", prompt=f"think {i}", n=3, metadata={"extra_info": {"sleep_s": 2.0}})
                 for i in range(6)]
        await prompts.produce(tasks)
        await wait_for(lambda: _zero(prompts), 90, "every prompt acknowledged")
        await asyncio.sleep(1.0)  # a regenerated copy would still be on its way
        entries = await redis_client.xrange(keys.experiences_stream(run))
        exps = await read_experiences(redis_client, run)
    finally:
        for p in procs:
            stop(p)
        stop(reward_proc)
    assert sorted(e.id for e in exps) == sorted(sample_id(t.id, i) for t in tasks for i in range(3))
    assert len(entries) == 18, f"{len(entries)} experiences generated for 18 samples: groups were regenerated"
    assert await redis_client.xlen(keys.dead_letter_stream(keys.prompts_stream(run))) == 0


async def test_groups_that_finish_together_are_scored_and_pushed_together(redis_server, redis_client, tiny_model_dir,
                                                                          tmp_path, reward_service):
    """Four prompts taken at once: their /score calls share one request (worker.reward_batch_ms) and the four groups
    go to the experiences stream in one push, each group whole and each prompt acknowledged."""
    run = "worker-together"
    cfg = worker_config(tiny_model_dir, redis_server.url, run, reward_service, concurrency=4, reward_batch_ms=500)
    proc, url, _ = start_rollout(tmp_path, "worker-together", cfg)
    try:
        async with httpx.AsyncClient() as c:
            before = (await c.get(f"http://127.0.0.1:{reward_service}/metrics", timeout=10)).text
            prompts = StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask)
            await prompts.produce([PromptTask(id=f"g{i}", prompt=f"say a {i}", n=3) for i in range(4)])
            await wait_for(lambda: _zero(prompts), 60, "all prompts acked")
            rollout_metrics = (await c.get(f"{url}/metrics", timeout=10)).text
            after = (await c.get(f"http://127.0.0.1:{reward_service}/metrics", timeout=10)).text
    finally:
        stop(proc)
    exps = await read_experiences(redis_client, run)
    assert sorted(e.id for e in exps) == sorted(sample_id(f"g{i}", j) for i in range(4) for j in range(3))
    assert _sample(rollout_metrics, "fleetrl_rollout_worker_pushes_total") == 1
    assert _sample(after, "fleetrl_reward_requests_total", 'route="/score"') - \
        _sample(before, "fleetrl_reward_requests_total", 'route="/score"') == 1


def _sample(text: str, name: str, label: str = "") -> float:
    """The sum of a metric's samples (those whose labels hold ``label``) in a Prometheus text exposition."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and (line[len(name)] in " {") and label in line)
