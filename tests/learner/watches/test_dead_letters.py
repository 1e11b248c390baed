"""The dead-letter handler on a real Redis (services/learner/watches/dead_letters.py): a dead letter past
``rollout.dead_letter_retries`` gives its position up, and the watch's cursors land in the run state it is handed,
so a learner resumed from that state does not act on the same dead letter again. The re-issue path runs in whole
runs in tests/learner/rl/test_runner.py."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.learner.checkpoint import CheckpointManager
from services.learner.counters import Counters
from services.learner.observability import MetricsSink
from services.learner.rl.commits import Commits
from services.learner.rl.group_buffer import GroupBuffer
from services.learner.rl.positions import Positions
from services.learner.run_state import InFlight, RunState
from services.learner.watches import dead_letters
from services.learner.watches.dead_letters import DeadLetterHandler
from services.learner.watches.queue import DeadLetterWatch
from shared import keys
from shared.codec import encode
from shared.experience_queue import Lease, ProcessedIds, StreamQueue
from shared.schemas import Experience, PromptTask
from tests.learner.helpers import settings

RUN = "dead-letter-handler-test"


def handler(tmp_path, redis_client, state: RunState, registry: CollectorRegistry) -> DeadLetterHandler:
    s = settings(tmp_path, tmp_path, observability={"progress_bar": False})
    counters = Counters(state, MetricsSink(s.observability, tmp_path / "run", registry))
    buffer = GroupBuffer()
    queue = StreamQueue(redis_client, keys.experiences_stream(RUN), "learner", Experience)
    commits = Commits(CheckpointManager(tmp_path / "ckpt"), ProcessedIds(redis_client, "unused"), queue,
                      Lease(queue, "learner-0"), buffer)
    positions = Positions(state.in_flight, state.abandoned, buffer, commits, counters)
    watch = DeadLetterWatch(redis_client, RUN, state.dead_letter_cursors)

    async def reissue(key: str, why: str) -> bool:
        raise AssertionError(f"retries 0: the first dead letter gives {key} up, never re-issues it ({why})")

    return DeadLetterHandler(watch, state.in_flight, state.dead_letter_cursors, buffer, reissue, positions.abandon,
                             retries=0)


async def test_a_dead_letter_is_acted_on_once_across_a_resume(tmp_path, redis_client, monkeypatch):
    monkeypatch.setattr(dead_letters, "POLL_INTERVAL_S", 0.0)
    state = RunState(in_flight={"e0-3": InFlight(epoch=0, index=3, attempt=0, issued_at=0.0)})
    registry = CollectorRegistry()
    h = handler(tmp_path, redis_client, state, registry)
    eid = await redis_client.xadd(keys.dead_letter_stream(keys.prompts_stream(RUN)),
                                  {"payload": encode(PromptTask(id="e0-3", prompt="q", n=4)),
                                   "error": "prompt longer than the context"})
    await h.poll()
    assert "e0-3" not in state.in_flight and "longer than the context" in state.abandoned["e0-3"]
    assert state.counters["prompts_abandoned"] == 1
    assert registry.get_sample_value("fleetrl_learner_prompts_abandoned_total") == 1
    assert state.dead_letter_cursors == {"prompts": eid.decode(), "experiences": "0-0"}

    # a resume from a checkpoint of this state: the position is back in flight (say it was re-issued before the
    # checkpoint), and the dead letter already handled is not read again
    resumed = RunState.from_json(state.to_json())
    resumed.in_flight["e0-3"] = InFlight(epoch=0, index=3, attempt=0, issued_at=0.0)
    again = handler(tmp_path / "again", redis_client, resumed, CollectorRegistry())
    await again.poll()
    assert "e0-3" in resumed.in_flight and resumed.counters["prompts_abandoned"] == 1
