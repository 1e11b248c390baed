"""The Tinker API's sessions: created by a client, kept alive by its heartbeats, ended by its close or by silence.
Ending a session ends what it owns (its training models and sampling sessions) through ``on_end``."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from services.learner.tinker.errors import NotFound

log = logging.getLogger(__name__)

FINISHED_KEPT = 10_000  # ended session ids remembered, so that a repeated finish is answered the same


class Sessions:
    def __init__(self, timeout_s: float, on_end: Callable[[str], list[str]]) -> None:
        self.timeout_s = timeout_s
        self.on_end = on_end  # drops what the session owns; returns the ids dropped
        self.alive: dict[str, float] = {}  # session id -> its last heartbeat (monotonic)
        self.finished: dict[str, None] = {}  # the last FINISHED_KEPT ended sessions, oldest first

    def __len__(self) -> int:
        return len(self.alive)

    def create(self) -> str:
        session_id = f"fleetrl-{uuid.uuid4().hex[:16]}"
        self.alive[session_id] = time.monotonic()
        return session_id

    def require(self, session_id: str) -> None:
        if session_id not in self.alive:
            raise NotFound(f"session {session_id!r} is unknown; create a session first")

    def heartbeat(self, session_id: str) -> None:
        if session_id not in self.alive:
            raise NotFound(f"session {session_id!r} is unknown (the server restarted?); create a new ServiceClient")
        self.alive[session_id] = time.monotonic()

    def finish(self, session_id: str, status: str, detail: str | None) -> None:
        """``ServiceClient.close(status)``: end the session now. The first finish wins; finishing it again is a
        no-op, so a client that retries its close is answered the same."""
        if session_id in self.finished:
            return
        if session_id not in self.alive:
            raise NotFound(f"session {session_id!r} is unknown (the server restarted?)")
        self._end(session_id, f"finished by its client ({status}{': ' + detail if detail else ''})")

    def reap(self) -> None:
        """End the sessions whose client stopped beating: drop their models and sampling sessions."""
        now = time.monotonic()
        for session in [s for s, seen in self.alive.items() if now - seen > self.timeout_s]:
            self._end(session, f"no heartbeat for {self.timeout_s:.0f}s")

    def _end(self, session: str, why: str) -> None:
        del self.alive[session]
        self.finished[session] = None
        while len(self.finished) > FINISHED_KEPT:
            self.finished.pop(next(iter(self.finished)))
        dropped = self.on_end(session)
        log.info("session %s ended (%s): dropped %s", session, why, ", ".join(dropped) or "nothing")
