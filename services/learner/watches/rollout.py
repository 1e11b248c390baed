"""Whether the run's rollout fleet takes the prompts the learner issues: a learner waiting on a fleet that is not
there says so, in its log and in ``/status`` (phase ``waiting_for_rollout`` with ``waiting``: why), instead of
waiting without a word.

The evidence is the prompts stream's consumer group ``rollout``: prompts that wait (``lag``: never delivered to
any worker) while the group's last delivered entry has not moved for ``rollout.stall_warn_s`` mean no worker
takes them: none joined the run (a different ``run_name`` or ``redis_url``, the worker not enabled, no replica
started) or every worker stopped reading (crashed, or holding back).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from shared import keys

log = logging.getLogger(__name__)

GROUP = "rollout"


@dataclass(frozen=True)
class GroupSnapshot:
    """The ``rollout`` group of the prompts stream at one moment."""

    consumers: int
    waiting: int  # entries never delivered to a worker (lag)
    last_delivered: str


async def read_group(redis: Any, stream: str) -> GroupSnapshot | None:
    """The group as Redis reports it, or None while the stream or the group does not exist yet."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:
        return None
    for g in groups:
        name = g.get("name")
        if (name.decode() if isinstance(name, bytes) else name) == GROUP:
            last = g.get("last-delivered-id") or b"0-0"
            return GroupSnapshot(consumers=int(g.get("consumers") or 0), waiting=int(g.get("lag") or 0),
                                 last_delivered=last.decode() if isinstance(last, bytes) else str(last))
    return None


class RolloutWatch:
    """Polled by the learner service every few seconds; ``problem`` is the sentence to show, or None."""

    def __init__(self, redis: Any, run_name: str, stall_s: float, clock=time.monotonic) -> None:
        self.redis = redis
        self.run_name = run_name
        self.stall_s = stall_s
        self.clock = clock
        self.stream = keys.prompts_stream(run_name)
        self.problem: str | None = None
        self._moved_at = clock()
        self._last: str | None = None
        self._warned_at: float | None = None

    async def poll(self) -> str | None:
        snap = await read_group(self.redis, self.stream)
        now = self.clock()
        if snap is None or snap.waiting == 0 or snap.last_delivered != self._last:
            self._moved_at = now
            self._last = snap.last_delivered if snap is not None else None
            self._resolve()
            return None
        stalled = now - self._moved_at
        if stalled < self.stall_s:
            return self.problem
        who = ("no rollout worker has joined this run" if snap.consumers == 0 else
               f"its {snap.consumers} rollout worker(s) stopped taking prompts")
        self.problem = (f"no prompt taken for {stalled:.0f}s: {snap.waiting} prompts wait and {who} (is a rollout "
                        f"service with worker.enabled running with run_name {self.run_name!r} on this Redis?)")
        if self._warned_at is None or now - self._warned_at >= self.stall_s:
            log.warning("waiting for rollout: %s", self.problem)
            self._warned_at = now
        return self.problem

    def _resolve(self) -> None:
        if self.problem is not None:
            log.info("rollout workers take prompts again")
        self.problem = None
        self._warned_at = None
