"""PromptFeeder on a real Redis: the window is kept full across epoch boundaries, re-issues take the next attempt
id, and only timed-out positions without a complete group are issued again."""

from __future__ import annotations

import json

import prometheus_client
import pytest

from services.learner.counters import Counters
from services.learner.data import PromptSet
from services.learner.observability import MetricsSink
from services.learner.rl.prompt_feeder import PromptFeeder
from services.learner.run_state import RunState
from shared import keys
from shared.codec import decode
from shared.experience_queue import StreamQueue
from shared.schemas import PromptTask
from tests.learner.helpers import settings


@pytest.fixture()
def feeder_parts(tmp_path, tiny_model_dir, redis_client):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"input": f"q{i}", "label": i}) + "\n"
                                                    for i in range(3)))
    s = settings(tiny_model_dir, tmp_path, rollout={"group_size": 2, "window": 4, "prompt_timeout_s": 60},
                 data={"path": str(tmp_path / "prompts.jsonl"), "shuffle": False})
    sink = MetricsSink(s.observability, tmp_path / "run", prometheus_client.CollectorRegistry())
    prompts = StreamQueue(redis_client, keys.prompts_stream(s.run_name), "rollout", PromptTask)
    data = PromptSet.load(s.data, s.train.seed)
    state = RunState()

    def give_up(key: str, reason: str) -> None:
        state.abandoned[key] = reason
        del state.in_flight[key]

    return PromptFeeder(prompts, data, 2, state, s, Counters(state, sink), give_up), state, prompts


async def issued(prompts: StreamQueue) -> list[str]:
    """Ids of every task on the prompts stream, in order."""
    return [decode(fields[b"p"], PromptTask).id for _, fields in await prompts.redis.xrange(prompts.stream)]


async def test_the_window_stays_full_across_epochs_until_every_position_was_issued(feeder_parts):
    feeder, state, prompts = feeder_parts
    await feeder.feed()
    assert sorted(state.in_flight) == ["e0-0", "e0-1", "e0-2", "e1-0"]  # 3 prompts, window 4: into epoch 1
    assert (state.epoch, state.next_index) == (1, 1) and not feeder.exhausted()
    await feeder.feed()  # the window is full: nothing more
    assert await issued(prompts) == ["e0-0", "e0-1", "e0-2", "e1-0"]
    del state.in_flight["e0-0"], state.in_flight["e0-1"]  # two groups trained
    await feeder.feed()
    assert await issued(prompts) == ["e0-0", "e0-1", "e0-2", "e1-0", "e1-1", "e1-2"]
    assert feeder.exhausted() and state.counters["prompts_issued"] == 6
    await feeder.feed()  # two epochs issued: nothing more, however much room
    assert len(await issued(prompts)) == 6


async def test_reissue_takes_the_next_attempt_and_timeouts_skip_complete_groups(feeder_parts):
    feeder, state, prompts = feeder_parts
    await feeder.feed()
    for key in ("e0-0", "e0-1"):
        state.in_flight[key].issued_at -= 120  # older than rollout.prompt_timeout_s
    await feeder.reissue_timeouts(completed={"e0-1"})  # e0-1's group is complete, only waiting for a batch
    assert (await issued(prompts))[-1] == "e0-0-r1"
    assert state.in_flight["e0-0"].attempt == 1 and state.in_flight["e0-1"].attempt == 0
    await feeder.reissue("e0-0")
    assert (await issued(prompts))[-1] == "e0-0-r2" and state.in_flight["e0-0"].attempt == 2
    assert (state.counters["prompts_reissued"], state.counters["prompts_issued"]) == (2, 6)
