"""A session's finish pushes through the producers' one path (``ExperienceStream``) and keeps its own error policy:
a full stream or a Redis outage is a 503 naming what to retry, and the session stays open to finish again."""

from __future__ import annotations

import re

import pytest
import redis.exceptions
from prometheus_client import CollectorRegistry

from services.rollout.engines.types import Finish, SamplingParams, SequenceOutput
from services.rollout.sessions.manager import SessionManager, SessionUnavailable
from services.rollout.sessions.settings import SessionSettings
from shared.experience_queue import BackpressureTimeout
from shared.session_api import SessionCreate, SessionFinish


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


class Stream:
    """An experiences stream that fails its first pushes with ``errors``, then takes the group."""

    stream = "fleetrl:run:experiences"

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.pushed: list[list] = []

    async def push(self, group, timeout):
        if self.errors:
            raise self.errors.pop(0)
        self.pushed.append(group)


@pytest.mark.parametrize(("error", "says"), [
    (BackpressureTimeout("full"), "stayed full for 7s (the learner is behind); retry the finish"),
    (redis.exceptions.ConnectionError("gone"), "redis unavailable (ConnectionError); retry the finish"),
])
async def test_a_push_that_fails_is_503_and_the_session_finishes_on_retry(error, says):
    m = SessionManager(SessionSettings(push_timeout_s=7), redis_url=None, run_name="run", reward_url=None,
                       tokenizer=Tokenizer(), registry=CollectorRegistry())
    session = await m.create(SessionCreate(session_id="s-1", prompt_id="p"))
    m.record(session, [1, 2], SequenceOutput(rid="r", prompt_ids=(1, 2), output_ids=[3], logprobs=[-0.5],
                                             finish=Finish("stop")), SamplingParams())
    m._streams["run"] = stream = Stream(error)  # type: ignore[assignment]
    with pytest.raises(SessionUnavailable, match=re.escape(says)):
        await m.finish("s-1", SessionFinish(reward=1.0))
    assert m.get("s-1") is session and not session.busy and stream.pushed == []  # still open
    done = await m.finish("s-1", SessionFinish(reward=1.0))
    assert done.experience_ids == ["p#0"] and done.stream == stream.stream and [e.id for (e,) in stream.pushed] == ["p#0"]
