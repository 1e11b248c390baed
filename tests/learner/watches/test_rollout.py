"""A learner whose prompts no rollout worker takes says so (log, /status phase waiting_for_rollout) and stops
saying so once a worker takes them."""

import asyncio

import httpx
import pytest

from services.learner.watches.rollout import RolloutWatch
from shared import keys
from tests.learner.test_process import ENV, write_config
from tests.procs import spawn, stop, wait_http_ok


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_watch_names_a_stall_only_while_prompts_wait_unread(redis_client):
    stream = keys.prompts_stream("w")
    clock = Clock()
    watch = RolloutWatch(redis_client, "w", stall_s=10, clock=clock)
    assert await watch.poll() is None  # no stream yet: nothing issued, nothing to say
    await redis_client.xgroup_create(stream, "rollout", id="0", mkstream=True)
    await redis_client.xadd(stream, {"p": "1"})
    await redis_client.xadd(stream, {"p": "2"})
    assert await watch.poll() is None
    clock.now = 9
    assert await watch.poll() is None  # not yet stall_s
    clock.now = 11
    problem = await watch.poll()
    assert "2 prompts wait and no rollout worker has joined this run" in problem and "'w'" in problem
    await redis_client.xreadgroup("rollout", "worker-a", {stream: ">"}, count=1)
    clock.now = 12
    assert await watch.poll() is None and watch.problem is None  # a worker took one: resolved at once
    clock.now = 30
    assert "its 1 rollout worker(s) stopped taking prompts" in await watch.poll()
    await redis_client.xreadgroup("rollout", "worker-a", {stream: ">"}, count=1)
    clock.now = 100
    assert await watch.poll() is None  # nothing waits: a quiet stream is no stall


@pytest.mark.process
async def test_a_learner_without_rollout_says_so_in_status_and_log(tmp_path, tiny_model_dir, redis_server,
                                                                   redis_client):
    cfg, url = write_config(tmp_path, tiny_model_dir, redis_server.url, n_prompts=8,
                            rollout={"group_size": 4, "window": 4, "stall_warn_s": 2})
    log = tmp_path / "learner.log"
    proc = spawn(["-m", "services.learner", "--config", str(cfg)], log, ENV)
    try:
        await asyncio.to_thread(wait_http_ok, f"{url}/health", proc, 90, log)
        async with httpx.AsyncClient(timeout=5) as client:
            status = {}
            for _ in range(60):
                status = (await client.get(f"{url}/status")).json()
                if status["phase"] == "waiting_for_rollout":
                    break
                await asyncio.sleep(0.5)
            assert status["phase"] == "waiting_for_rollout", status
            assert "4 prompts wait and no rollout worker has joined this run" in status["waiting"]
            assert "waiting for rollout: no prompt taken for" in log.read_text()
            stream = keys.prompts_stream("proc")
            await redis_client.xreadgroup("rollout", "worker-a", {stream: ">"}, count=1)
            for _ in range(20):
                status = (await client.get(f"{url}/status")).json()
                if status["phase"] == "running":
                    break
                await asyncio.sleep(0.5)
            assert status["phase"] == "running" and "waiting" not in status, status
    finally:
        stop(proc)
