"""A third-party rollout function and environment: each registered with its settings model, configured in the
rollout settings (``worker.rollout_function`` + ``worker.function_settings``; ``worker.agent.environment`` +
``environment_args``), and run by the real rollout worker (in this process, the tiny model's hf engine, a real
Redis): their trajectories become experiences with the rewards they set."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from services.rollout.agents.environments import ENVIRONMENTS, EnvReply, EnvStart
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from services.rollout.worker.functions import ROLLOUT_FUNCTIONS
from services.rollout.worker.group import sampling_record
from services.rollout.worker.trajectory import TrajectoryBuilder
from shared import keys
from shared.experience_queue import StreamQueue
from shared.schemas import Experience, PromptTask
from shared.settings import SettingsError, load_settings


# ---- a rollout function: n samples of a few tokens, rewarded by their length times a factor ------------
class LengthSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    factor: float = Field(default=1.0, gt=0, description="Reward per generated token.")
    tokens: int = Field(default=3, ge=1, le=16, description="Tokens per sample.")


async def scaled_length(ctx) -> list:
    opts: LengthSettings = ctx.settings.function_settings
    ids, _ = ctx.prompt()
    params = replace(ctx.params, max_new_tokens=opts.tokens, ignore_eos=True)
    out = []
    for o in await ctx.generate(ids, params, n=ctx.task.n):
        b = TrajectoryBuilder(ids)
        b.model(o.output_ids, o.logprobs, o.weight_version)
        out.append(b.build(finish_reason=o.finish.type, reward=opts.factor * len(o.output_ids),
                           sampling=sampling_record(params)))
    return out


# ---- an environment: done after ``turns`` assistant turns, with its own reward --------------------------
class FixedRewardArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    turns: int = Field(default=1, ge=1)
    reward: float = Field(default=0.25)


class FixedRewardEnv:
    def __init__(self, turns: int = 1, reward: float = 0.25) -> None:
        self.turns, self.reward, self.seen = turns, reward, 0

    async def reset(self, task: PromptTask) -> EnvStart:
        return EnvStart(messages=[{"role": "user", "content": "say something"}])

    async def step(self, message: dict[str, Any]) -> EnvReply:
        self.seen += 1
        if self.seen >= self.turns:
            return EnvReply(done=True, reward=self.reward, components={"fixed": self.reward})
        return EnvReply(messages=[{"role": "user", "content": "more"}])

    async def close(self) -> None: ...


async def run_worker(redis_server, redis_client, model_dir, run: str, worker: dict, n: int = 2) -> list[Experience]:
    settings = RolloutSettings(
        model=str(model_dir), redis_url=redis_server.url, run_name=run, weight_sidecar=False,
        engine={"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
        worker={"enabled": True, "reward_url": "http://127.0.0.1:9", "poll_interval_s": 0.1,
                "prompts_max_deliveries": 1, "sampling": {"max_new_tokens": 4}, **worker})
    svc = RolloutService(settings)
    await svc.start()
    try:
        await StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask).produce(
            PromptTask(id="p", prompt="hello", n=n))
        out: list[Experience] = []
        q = StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience)
        await q.ensure_group()
        deadline = time.monotonic() + 60
        while len(out) < n and time.monotonic() < deadline:
            dead = await redis_client.xlen(keys.dead_letter_stream(keys.prompts_stream(run)))
            assert dead == 0, await redis_client.xrange(keys.dead_letter_stream(keys.prompts_stream(run)))
            out += [d.record for d in await q.consume("t", count=100, block_ms=100)]
            await asyncio.sleep(0.05)
        return out
    finally:
        await svc.stop()


async def test_a_registered_rollout_function_is_configured_and_run_by_the_worker(redis_server, redis_client,
                                                                               tiny_model_dir, registered):
    worker = {"rollout_function": "length_test", "function_settings": {"factor": 0.5, "tokens": 3}}
    with pytest.raises(SettingsError, match="worker.rollout_function: .*'length_test': not a known name"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), worker=worker)
    registered(ROLLOUT_FUNCTIONS, "length_test", LengthSettings, "tests.plugins.test_rollout_plugins:scaled_length")
    with pytest.raises(SettingsError, match="worker.function_settings.factor: Input should be greater than 0"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), worker={**worker, "function_settings": {"factor": 0}})
    with pytest.raises(SettingsError, match="takes its settings in worker.agent"):
        load_settings(RolloutSettings, model=str(tiny_model_dir),
                      worker={"rollout_function": "multi_turn", "function_settings": {"factor": 1}})
    exps = await run_worker(redis_server, redis_client, tiny_model_dir, "plugin-length", worker)
    assert len(exps) == 2
    assert all(len(e.response_token_ids) == 3 and e.reward == 1.5 for e in exps), exps


async def test_a_registered_environment_is_configured_and_driven_by_multi_turn(redis_server, redis_client,
                                                                             tiny_model_dir, registered):
    worker = {"rollout_function": "multi_turn",
              "agent": {"environment": "fixed_test", "environment_args": {"turns": 2, "reward": 0.75}}}
    with pytest.raises(SettingsError, match="'fixed_test': not a known name"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), worker=worker)
    registered(ENVIRONMENTS, "fixed_test", FixedRewardArgs, FixedRewardEnv)
    with pytest.raises(SettingsError, match=r"environment 'fixed_test' arguments: turn: Extra inputs are not permitted"):
        load_settings(RolloutSettings, model=str(tiny_model_dir),
                      worker={**worker, "agent": {"environment": "fixed_test", "environment_args": {"turn": 2}}})
    exps = await run_worker(redis_server, redis_client, tiny_model_dir, "plugin-env", worker)
    assert len(exps) == 2
    assert all(e.reward == 0.75 and e.reward_components == {"fixed": 0.75} for e in exps), exps
