"""Stitching a session's calls into trajectories and experiences (pure functions, hand-computed values)."""

from __future__ import annotations

import pytest

from services.rollout.engines.types import SamplingParams
from services.rollout.sessions.trajectory import Call, SamplingMismatch, SessionIdentity, append, experiences

P = SamplingParams(max_new_tokens=4, temperature=1.0)


def call(prompt, out, version=0, params=P, finish="stop"):
    return Call(list(prompt), list(out), [-0.5] * len(out), finish, version, params)


def test_extension_masks_env_tokens_and_spans_versions():
    ts = []
    assert append(ts, call([1, 2], [3, 4], version=5)) is False
    assert append(ts, call([1, 2, 3, 4, 9], [6], version=6, finish="length")) is True
    (t,) = ts
    assert t.response_ids == [3, 4, 9, 6] and t.mask == [1, 1, 0, 1] and t.logprobs == [-0.5, -0.5, 0.0, -0.5]
    who = SessionIdentity(session_id="s", prompt_id="p", group_id="g", group_size=2, index=1)
    (e,) = experiences(who, ts, [1.0], [{}], [("a", "b")])
    assert e.id == "p#1" and e.finish_reason == "length"
    assert e.weight_version == 5 and e.version_spans == [(0, 5), (3, 6)] and e.token_versions() == [5, 5, 5, 6]


def test_one_version_has_no_spans_and_a_rewrite_starts_a_second_trajectory():
    ts = []
    append(ts, call([1, 2], [3]))
    assert append(ts, call([1, 7], [8])) is False
    who = SessionIdentity(session_id="s", prompt_id="p", group_id="p", group_size=1, index=0)
    a, b = experiences(who, ts, [0.0, 0.0], [{}, {}], [("", "")] * 2)
    assert (a.id, b.id) == ("p#0", "p#0~1") and a.version_spans is None and list(b.prompt_token_ids) == [1, 7]


def test_sampling_change_inside_a_trajectory_is_refused_but_a_new_one_may_differ():
    ts = []
    append(ts, call([1], [2]))
    with pytest.raises(SamplingMismatch, match="temperature=1.0"):
        append(ts, call([1, 2, 3], [4], params=SamplingParams(temperature=0.5)))
    assert append(ts, call([9], [4], params=SamplingParams(temperature=0.5))) is False
    assert len(ts) == 2


def test_a_sessions_experiences_bear_the_grant_it_was_opened_with():
    """An orchestrator passes the learner's task grant to POST /sessions; without one the experiences bear none,
    and the learner does not train them (services/learner/rl/grants.py)."""
    ts = []
    append(ts, call([1, 2], [3, 4], version=0))
    granted = SessionIdentity(session_id="s", prompt_id="e0-1", group_id="e0-1", group_size=1, index=0, grant="g" * 40)
    assert [e.grant for e in experiences(granted, ts, [1.0], [{}], [("a", "b")])] == ["g" * 40]
    chosen = SessionIdentity(session_id="s", prompt_id="e0-1", group_id="e0-1", group_size=1, index=0)
    assert [e.grant for e in experiences(chosen, ts, [1.0], [{}], [("a", "b")])] == [None]
