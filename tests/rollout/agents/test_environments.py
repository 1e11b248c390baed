"""The environment adapters: an unmodified OpenEnv server (its own process, openenv-core's server and client) and
reasoning-gym datasets (prompt source + their own scoring) driven by the multi_turn rollout function; and an
environment failing inside the real worker dead-letters its prompt with the reason while the worker goes on."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from services.rollout.agents.envs.reasoning_gym import dataset, reasoning_gym_tasks
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from services.rollout.worker.contract import GroupFailed
from shared import keys
from shared.experience_queue import StreamQueue
from shared.ports import free_port
from shared.schemas import Experience, PromptTask
from tests.procs import spawn, starts_processes, stop, wait_http_ok
from tests.rollout.agents.test_multi_turn import RecordingRewards, run

pytest.importorskip("openenv")


@pytest.fixture(scope="module")
@starts_processes
def openenv_url(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("openenv") / "openenv.log"
    proc = spawn(["-m", "tests.rollout.agents.openenv_server", "--port", str(port)], log)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", proc, timeout=60, log=log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def say(prompt: str) -> str:
    return "the letter a" if "I heard" in prompt else "b"


async def test_an_openenv_server_runs_unmodified_as_a_multi_turn_environment(tiny_model_dir, openenv_url):
    agent = {"environment": "openenv", "environment_args": {
        "base_url": openenv_url, "observation_field": "prompt", "reset_args": {"seed": 0}}}
    rewards = RecordingRewards()
    trajs, svc = await run(tiny_model_dir, say, agent, PromptTask(id="oe", prompt="Play along.", n=2), rewards=rewards)
    for t in trajs:
        text = svc.tokenizer.decode(list(t.prompt_ids) + list(t.response_ids), skip_special_tokens=False)
        assert "<|im_start|>user\nSay the letter a.<|im_end|>" in text  # the server's first observation
        assert "<|im_start|>user\nI heard 'b'; say a.<|im_end|>" in text  # its reply to the first step
        assert [x.kind for x in t.turns] == ["model", "environment", "model"]
        assert t.finish_reason == "stop" and t.reward == 1.0 and t.reward_components == {"environment": 1.0}
    assert rewards.items == []  # the server's reward, not the reward service's


async def test_an_openenv_episode_that_runs_out_ends_with_the_servers_reward(tiny_model_dir, openenv_url):
    agent = {"environment": "openenv", "environment_args": {"base_url": openenv_url, "reset_args": {"seed": 2}}}
    (t,), svc = await run(tiny_model_dir, lambda p: "zzz", agent, PromptTask(id="oe2", prompt="Play."))
    text = svc.tokenizer.decode(list(t.prompt_ids), skip_special_tokens=False)
    first = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert json.loads(first) == {"prompt": "Say the letter c.", "attempts": 0}  # the whole observation, as JSON
    assert t.finish_reason == "stop" and t.reward == 0.0 and sum(x.kind == "model" for x in t.turns) == 3


async def test_an_unreachable_openenv_server_fails_the_group_with_the_reason(tiny_model_dir):
    agent = {"environment": "openenv", "trajectory_retries": 1,
             "environment_args": {"base_url": f"http://127.0.0.1:{free_port()}", "connect_timeout_s": 2}}
    with pytest.raises(GroupFailed, match="failed 2 times.*reset raised ConnectionError: Failed to connect"):
        await run(tiny_model_dir, lambda p: "x", agent, PromptTask(id="oe3", prompt="Play."))


@pytest.mark.parametrize("correct", [True, False])
async def test_reasoning_gym_tasks_are_scored_by_their_dataset(tiny_model_dir, correct):
    tasks = reasoning_gym_tasks("chain_sum", size=3, seed=1, n=1)
    assert [t.id for t in tasks] == ["chain_sum-1-0", "chain_sum-1-1", "chain_sum-1-2"]
    task = tasks[1]
    entry = dataset("chain_sum", 3, 1)[1]
    assert task.label == entry["answer"] and task.prompt[0].content == entry["question"]
    answer = entry["answer"] if correct else "no idea"
    rewards = RecordingRewards()
    (t,), _ = await run(tiny_model_dir, lambda p: f"Let me think.\n<answer>{answer}</answer>", {"environment": "echo"},
                        task, rewards=rewards)  # the task's metadata picks the reasoning_gym environment
    assert t.reward == (1.0 if correct else 0.0) and t.reward_components == {"reasoning_gym": t.reward}
    assert t.finish_reason == "stop" and rewards.items == []


async def test_a_failing_environment_in_the_worker_dead_letters_its_prompt_and_the_worker_goes_on(
        redis_server, redis_client, tiny_model_dir, tmp_path):
    run_name = "env-fail"
    marker = tmp_path / "ran"
    settings = RolloutSettings(
        model=str(tiny_model_dir), redis_url=redis_server.url, run_name=run_name, weight_sidecar=False,
        engine={"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
        worker={"enabled": True, "reward_url": "http://127.0.0.1:9", "poll_interval_s": 0.1,
                "prompts_max_deliveries": 1, "rollout_function": "multi_turn", "sampling": {"max_new_tokens": 6},
                "agent": {"environment": "calculator", "trajectory_retries": 1, "env_timeout_s": 0.5,
                          "environments": {"hangs": "tests.rollout.agents.sample_envs:Hangs"}}})
    svc = RolloutService(settings)
    await svc.start()
    try:
        await StreamQueue(redis_client, keys.prompts_stream(run_name), "rollout", PromptTask).produce([
            PromptTask(id="broken", prompt="q", n=2, metadata={"environment": "hangs"}),
            PromptTask(id="evil", prompt="q", metadata={"environment": "subprocess:Popen",
                                                        "environment_args": {"args": ["touch", str(marker)]}}),
            PromptTask(id="fine", prompt="What is 2 + 2?", label=4, n=2)])
        deadline = time.monotonic() + 60
        while await redis_client.xlen(keys.prompts_stream(run_name)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        entries = await redis_client.xrange(keys.dead_letter_stream(keys.prompts_stream(run_name)))
        errors = [e[b"error"].decode() for _, e in entries]
        hung = next(e for e in errors if "Popen" not in e)
        assert "failed 2 times" in hung and "environment hangs: step did not answer within 0.5s" in hung
        refused = next(e for e in errors if "subprocess:Popen" in e)
        assert "is not one this worker allows a task to pick" in refused and len(entries) == 2
        assert not marker.exists()  # the task's import path was never imported, let alone called
        q = StreamQueue(redis_client, keys.experiences_stream(run_name), "learner", Experience)
        await q.ensure_group()
        exps = [d.record for d in await q.consume("l", count=10, block_ms=500)]
        assert sorted(e.id for e in exps) == ["fine#0", "fine#1"]  # the worker carried on
        assert all(e.reward in (0.0, 1.0) and e.reward_components == {"environment": e.reward} for e in exps)
    finally:
        await svc.stop()
