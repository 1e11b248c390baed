"""Prompts out: the run owner's side of the prompts stream.

Keeps up to ``rollout.window`` dataset positions in flight (``RunState.in_flight``, saved in checkpoints: the
feeder owns that map and the dataset cursor, :class:`FeedState`; the other parts read the map, and ``Positions``
takes a position out when its life ends), walking the prompt set epoch by epoch, and issues a position again under a new attempt id
(``e{epoch}-{index}-r{n}``) when its group timed out, went stale, was dead-lettered or was lost by a restarted
Redis. Every task carries the learner's grant for its group (``grants.py``), and the size it was issued with is
recorded in ``InFlight``: the learner files only experiences of groups it issued. What to do with the
experiences that come back is the runner's and the group buffer's business.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Protocol

from services.learner.counters import Counters
from services.learner.data import PromptSet
from services.learner.rl.grants import grant
from services.learner.run_state import InFlight
from services.learner.settings import LearnerSettings
from services.learner.watches.queue import prompts_lost_by_redis
from shared.experience_queue import BackpressureTimeout, StreamQueue
from shared.group_id import GroupId
from shared.schemas import PromptTask

log = logging.getLogger(__name__)


class FeedState(Protocol):
    """What the feeder keeps of the run state (``RunState`` is one): the dataset position of the next prompt, the
    positions in flight, and the key of the grants its tasks carry."""

    epoch: int
    next_index: int
    in_flight: dict[str, InFlight]

    @property
    def grant_key(self) -> str: ...


class PromptFeeder:
    """Issues and re-issues prompt tasks; ``state`` is the run's cursor and positions in flight (:class:`FeedState`);
    ``give_up(position, reason)`` ends a position past ``rollout.max_attempts`` (``Positions.abandon``)."""

    def __init__(self, prompts: StreamQueue, data: PromptSet, epochs: int, state: FeedState,
                 settings: LearnerSettings, counters: Counters, give_up: Callable[[str, str], None]) -> None:
        self.prompts = prompts
        self.data = data
        self.epochs = epochs  # passes over the prompt set (data.epoch_plan: cycled until max_steps)
        self.state = state
        self.s = settings
        self.counters = counters
        self.give_up = give_up

    def exhausted(self) -> bool:
        """Every position of every epoch was issued (some may still be in flight)."""
        return self.state.epoch >= self.epochs

    async def feed(self) -> None:
        """Issue the next positions until ``rollout.window`` are in flight (a full prompt stream: next time)."""
        st, data = self.state, self.data
        room = self.s.rollout.window - len(st.in_flight)
        if room <= 0 or self.exhausted():
            return
        positions: list[tuple[int, int]] = []
        epoch, index = st.epoch, st.next_index
        while len(positions) < room and epoch < self.epochs:
            positions.append((epoch, index))
            index += 1
            if index >= len(data):
                epoch, index = epoch + 1, 0
        tasks = [self._task(e, i, 0) for e, i in positions]
        try:
            entries = await self.prompts.produce(tasks, timeout=self.s.queue.produce_timeout_s)
        except BackpressureTimeout as exc:
            log.warning("prompt stream is full, retrying later: %s", exc)
            return
        now = time.time()
        for (e, i), entry in zip(positions, entries):
            st.in_flight[GroupId(e, i).position] = InFlight(epoch=e, index=i, attempt=0, issued_at=now, entry=entry,
                                                 group_size=self.s.rollout.group_size)
        st.epoch, st.next_index = epoch, index
        self._count("prompts_issued", len(tasks))

    async def reissue(self, key: str, why: str = "re-issued") -> bool:
        """Issue in-flight position ``key`` again under its next attempt id; False when it had its
        ``rollout.max_attempts`` already and was given up instead (with ``why`` as the last reason)."""
        item = self.state.in_flight[key]
        if item.attempt + 1 >= self.s.rollout.max_attempts:
            reason = f"{item.attempt + 1} attempts (rollout.max_attempts={self.s.rollout.max_attempts}); last: {why}"
            self.give_up(key, reason)
            return False
        task = self._task(item.epoch, item.index, item.attempt + 1, item.group_size or None)
        [item.entry] = await self.prompts.produce([task], timeout=self.s.queue.produce_timeout_s)
        item.group_size = task.n
        item.attempt += 1
        item.issued_at = time.time()
        self._count("prompts_issued")
        self._count("prompts_reissued")
        return True

    async def reissue_timeouts(self, completed: Collection[str]) -> None:
        """Re-issue positions issued more than ``rollout.prompt_timeout_s`` ago whose group is not complete
        (``completed``: positions with a complete group buffered)."""
        limit = time.time() - self.s.rollout.prompt_timeout_s
        for key, item in list(self.state.in_flight.items()):
            if item.issued_at < limit and key not in completed:
                log.warning("prompt %s (attempt %d) timed out; re-issuing", key, item.attempt)
                await self.reissue(key, f"no complete group within rollout.prompt_timeout_s="
                                        f"{self.s.rollout.prompt_timeout_s:g}s")

    async def reissue_lost(self, redis) -> None:
        """Re-issue the in-flight prompts a restarted Redis no longer has (lost before they were persisted)."""
        entries = {key: item.entry for key, item in self.state.in_flight.items()}
        lost = await prompts_lost_by_redis(redis, self.prompts.stream, entries)
        if lost:
            log.warning("Redis lost %d prompt tasks issued just before it went down (not yet persisted); "
                        "re-issuing them", len(lost))
        for key in lost:
            await self.reissue(key, "Redis lost the prompt task")

    def _task(self, epoch: int, index: int, attempt: int, group_size: int | None = None) -> PromptTask:
        """The prompt task of a position's attempt, with the grant of its group (a re-issue keeps the size the
        position was first issued with)."""
        task = self.data.task(epoch, index, attempt, self.s.rollout)
        if group_size is not None and group_size != task.n:
            task = task.model_copy(update={"n": group_size})
        return task.model_copy(update={"grant": grant(self.state.grant_key, task.id, task.n)})

    def _count(self, name: str, n: int = 1) -> None:
        self.counters.add(name, n)
