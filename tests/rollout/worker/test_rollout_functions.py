"""Rollout functions as plug-ins: chosen by name or import path in the settings, checked when loaded (a bad path
or signature is a one-line settings error), and run by the real worker (in this process, on the tiny model's hf
engine, against a real Redis): a custom function's trajectories become experiences; one that raises, or returns
the wrong thing, dead-letters its prompt with the reason while the worker carries on."""

from __future__ import annotations

import pytest

from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from services.rollout.worker.functions import ROLLOUT_FUNCTIONS, load_rollout_function
from shared import keys
from shared.experience_queue import StreamQueue
from shared.schemas import Experience, PromptTask, sample_id
from shared.settings import SettingsError, load_settings
from tests.rollout.test_worker import wait_for

PLUGINS = "tests.rollout.worker.plugins"


@pytest.mark.parametrize("name", sorted(ROLLOUT_FUNCTIONS))
def test_every_registered_rollout_function_loads(name):
    assert callable(load_rollout_function(name))


@pytest.mark.parametrize(("spec", "problem"), [
    ("no_such_function", "not a known name (multi_turn, openai_agent, single_turn) nor an import path"),
    ("no.such.module:fn", "cannot import module 'no.such.module'"),
    (f"{PLUGINS}:missing", f"'{PLUGINS}' has no attribute 'missing'"),
    (f"{PLUGINS}:two_args", "cannot be called as RolloutFunction (ctx)"),
    (f"{PLUGINS}:not_async", "must be async"),
    (f"{PLUGINS}:NOT_CALLABLE", "int object is not a RolloutFunction"),
])
def test_a_bad_rollout_function_is_a_one_line_settings_error(tmp_path, tiny_model_dir, spec, problem):
    cfg = tmp_path / "rollout.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\nworker: {{rollout_function: '{spec}'}}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(RolloutSettings, cfg)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and lines[1].startswith("  worker.rollout_function:"), lines
    assert problem in lines[1] and spec in lines[1]


def test_a_bad_environment_is_a_one_line_settings_error(tmp_path, tiny_model_dir):
    cfg = tmp_path / "rollout.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\nworker: {{rollout_function: multi_turn, agent: {{environment: nope}}}}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(RolloutSettings, cfg)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and "worker.agent.environment" in lines[1] and "'nope': not a known name" in lines[1]


async def drain(redis_client, run: str) -> list[Experience]:
    q = StreamQueue(redis_client, keys.experiences_stream(run), "learner", Experience)
    await q.ensure_group()
    out = []
    while ds := await q.consume("test-learner", count=100, block_ms=100):
        out.extend(d.record for d in ds)
        await q.ack([d.id for d in ds])
    return out


async def test_a_custom_rollout_function_runs_in_the_worker_and_failures_dead_letter(redis_server, redis_client,
                                                                                     tiny_model_dir):
    run = "plugin-fn"
    settings = RolloutSettings(
        model=str(tiny_model_dir), redis_url=redis_server.url, run_name=run, weight_sidecar=False,
        engine={"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
        worker={"enabled": True, "reward_url": "http://127.0.0.1:9", "rollout_function": f"{PLUGINS}:length_rewarded",
                "poll_interval_s": 0.1, "prompts_max_deliveries": 1}, run={"prompt_claim_idle_ms": 60_000})
    svc = RolloutService(settings)
    await svc.start()
    prompts = StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask)
    dead = keys.dead_letter_stream(keys.prompts_stream(run))
    try:
        await prompts.produce([PromptTask(id="bug", prompt="x", n=2, metadata={"explode": True}),
                               PromptTask(id="ok", prompt="hello", n=3, metadata={"k": 1})])
        await wait_for(lambda: _gone(redis_client, run), 60, "both prompts settled")
        exps = await drain(redis_client, run)
        assert sorted(e.id for e in exps) == [sample_id("ok", i) for i in range(3)]
        for e in exps:
            assert e.reward == len(e.response_token_ids) == 3 and e.reward_components == {"length": 3.0}
            assert e.metadata == {"k": 1, "custom": True} and e.sampling.max_tokens == 3
            assert len(e.response_logprobs) == 3 and all(lp <= 0 for lp in e.response_logprobs)
        (entry,) = await redis_client.xrange(dead)
        assert b"RuntimeError: this plug-in has a bug" in entry[1][b"error"]
    finally:
        await svc.stop()


@pytest.mark.parametrize(("fn", "reason"), [
    ("one_too_few", "returned 1 trajectories for a group of 2"),
    ("not_trajectories", "returned a dict, not a Trajectory"),
])
async def test_a_rollout_function_returning_the_wrong_thing_dead_letters_its_prompt(redis_server, redis_client,
                                                                                     tiny_model_dir, fn, reason):
    run = f"plugin-{fn}"
    settings = RolloutSettings(
        model=str(tiny_model_dir), redis_url=redis_server.url, run_name=run, weight_sidecar=False,
        engine={"kind": "hf", "device": "cpu", "torch_threads": 1, "max_wait_ms": 2},
        worker={"enabled": True, "reward_url": "http://127.0.0.1:9", "rollout_function": f"{PLUGINS}:{fn}",
                "poll_interval_s": 0.1, "prompts_max_deliveries": 1})
    svc = RolloutService(settings)
    await svc.start()
    try:
        await StreamQueue(redis_client, keys.prompts_stream(run), "rollout", PromptTask).produce(
            PromptTask(id="p", prompt="x", n=2))
        await wait_for(lambda: _gone(redis_client, run), 60, "the prompt dead-lettered")
        (entry,) = await redis_client.xrange(keys.dead_letter_stream(keys.prompts_stream(run)))
        assert reason in entry[1][b"error"].decode() and fn in entry[1][b"error"].decode()
        assert await redis_client.xlen(keys.experiences_stream(run)) == 0
    finally:
        await svc.stop()


async def _gone(redis_client, run: str) -> bool:
    return await redis_client.xlen(keys.prompts_stream(run)) == 0
