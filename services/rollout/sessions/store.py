"""Open sessions in memory, bounded: at most ``max_sessions`` open, each at most ``max_calls`` calls, idle
ones expire after ``ttl_s``. Finished and expired ids are remembered (bounded) so that a late call hears
409 / "expired" instead of a bare 404."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from services.rollout.errors import RequestError
from services.rollout.sessions.settings import SessionSettings
from services.rollout.sessions.trajectory import Recording, SessionIdentity

Gone = Literal["finished", "expired", "deleted"]


class SessionNotFound(RequestError):
    status = 404
    type = "not_found"


class UnknownSession(SessionNotFound):
    """No session by that id, here or (with several replicas) anywhere in the fleet."""


class SessionConflict(RequestError):
    status = 409
    type = "conflict"


class TooManySessions(RequestError):
    status = 429
    type = "overloaded"
    retry_after = True


@dataclass
class ChatTurn:
    """The last chat call of a session, to continue from its exact ids (see :mod:`.chat`)."""

    messages: list[dict[str, Any]]
    reply: dict[str, Any]
    prompt_ids: list[int]
    output_ids: list[int]
    template_key: str


@dataclass
class Session:
    who: SessionIdentity
    run: str
    trajectories: list[Recording] = field(default_factory=list)
    calls: int = 0
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False  # a call or the finish is in flight
    chat: ChatTurn | None = None

    @property
    def id(self) -> str:
        return self.who.session_id

    @property
    def tokens(self) -> int:
        return sum(t.length for t in self.trajectories)


class SessionStore:
    def __init__(self, settings: SessionSettings) -> None:
        self.cfg = settings
        self.open: dict[str, Session] = {}
        self.gone: OrderedDict[str, Gone] = OrderedDict()

    def create(self, who: SessionIdentity, run: str) -> Session:
        sid = who.session_id
        if sid in self.open or sid in self.gone:
            raise SessionConflict(f"session {sid!r} already exists ({self.gone.get(sid, 'open')}); pick another id")
        if len(self.open) >= self.cfg.max_sessions:
            raise TooManySessions(f"{len(self.open)} sessions are open, the limit (sessions.max_sessions); finish or "
                                  "delete sessions, or retry once idle ones expire")
        session = Session(who=who, run=run)
        self.open[sid] = session
        return session

    def get(self, sid: str) -> Session:
        """The open session ``sid``: 404 if unknown or expired, 409 if finished or deleted."""
        session = self.open.get(sid)
        if session is not None:
            return session
        gone = self.gone.get(sid)
        if gone == "expired":
            raise SessionNotFound(f"session {sid!r} expired after {self.cfg.ttl_s:g}s idle (sessions.ttl_s); its calls "
                                  "were dropped")
        if gone is not None:
            raise SessionConflict(f"session {sid!r} is {gone}: no more calls or finishing")
        raise UnknownSession(f"no session {sid!r} (create it with POST /sessions)")

    def known(self, sid: str) -> bool:
        return sid in self.open or sid in self.gone

    def close(self, sid: str, how: Gone) -> None:
        self.open.pop(sid, None)
        if self.cfg.remember_finished:
            self.gone[sid] = how
            self.gone.move_to_end(sid)
            while len(self.gone) > self.cfg.remember_finished:
                self.gone.popitem(last=False)

    def discard(self, sid: str) -> None:
        """Forget a session just created, as if it never was (its registration failed)."""
        self.open.pop(sid, None)

    def expired(self, now: float | None = None) -> list[Session]:
        """Idle sessions past the TTL (not those with a call in flight), closed as expired."""
        now = time.monotonic() if now is None else now
        out = [s for s in self.open.values() if not s.busy and now - s.last_used > self.cfg.ttl_s]
        for s in out:
            self.close(s.id, "expired")
        return out

    def expires_in(self, session: Session) -> float:
        return max(0.0, self.cfg.ttl_s - (time.monotonic() - session.last_used))


def new_session_id() -> str:
    return f"sess-{uuid.uuid4().hex}"
