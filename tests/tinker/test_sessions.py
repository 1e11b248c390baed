"""The Tinker API's sessions on their own (services/learner/tinker/sessions.py): what ends a session, and that
ending one ends what it owns, once."""

from __future__ import annotations

import pytest

from services.learner.tinker.errors import NotFound
from services.learner.tinker.sessions import Sessions


def test_a_finished_session_ends_what_it_owns_once_and_a_repeated_finish_is_answered_the_same():
    ended: list[str] = []
    sessions = Sessions(timeout_s=60, on_end=lambda s: ended.append(s) or [f"{s}:train:0"])
    sid = sessions.create()
    sessions.require(sid)
    sessions.finish(sid, "ok", None)
    sessions.finish(sid, "ok", None)  # a client that retries its close
    assert ended == [sid] and len(sessions) == 0
    with pytest.raises(NotFound):
        sessions.heartbeat(sid)
    with pytest.raises(NotFound):
        sessions.finish("fleetrl-never", "ok", None)


def test_only_sessions_silent_past_the_timeout_are_reaped(monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr("services.learner.tinker.sessions.time.monotonic", lambda: clock["now"])
    ended: list[str] = []
    sessions = Sessions(timeout_s=10, on_end=lambda s: ended.append(s) or [])
    quiet, beating = sessions.create(), sessions.create()
    clock["now"] = 108.0
    sessions.heartbeat(beating)
    clock["now"] = 111.0
    sessions.reap()
    assert ended == [quiet]
    sessions.require(beating)
    with pytest.raises(NotFound):
        sessions.require(quiet)
