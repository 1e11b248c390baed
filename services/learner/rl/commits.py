"""The ack rule of an RL run: checkpoint, then settle exactly what the checkpoint covers.

``Commits`` owns the ids waiting for a checkpoint: the parts that finish with a stream entry (the experience
intake when it drops one, ``Positions`` when a group is trained or dropped) hand its ids over with
``settle_later`` and keep nothing of them. At a commit the ids listed so far (sample ids trained, stream entries
trained or dropped since the previous commit) are written into the checkpoint with the trainer (``run_state.json``'s
commit lists); then the sample ids are marked processed (``ProcessedIds``) and the entries XACKed. Ids listed
after a checkpoint was begun wait for the next one. A commit whose settle did not reach Redis stays *unsettled*: it
is settled later (the loop retries after an outage), carried into the next checkpoint's lists, and settled on
resume from the checkpoint that recorded it, so a crash between the write and the acks loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from services.learner.checkpoint import CheckpointManager
from services.learner.rl.group_buffer import GroupBuffer
from services.learner.run_state import CommitIds, RunState
from shared.experience_queue import Lease, ProcessedIds, StreamQueue

log = logging.getLogger(__name__)


class SettleLater(Protocol):
    """What the parts that finish with stream entries are given of :class:`Commits`."""

    def settle_later(self, entry_ids: Iterable[str], sample_ids: Iterable[str] = ()) -> None: ...


class Commits:
    """Checkpoints and their settles for one run; also the futures of ``/checkpoint`` requests."""

    def __init__(self, ckpt: CheckpointManager, processed: ProcessedIds, experiences: StreamQueue, lease: Lease,
                 buffer: GroupBuffer) -> None:
        self.ckpt = ckpt
        self.processed = processed
        self.experiences = experiences
        self.lease = lease
        self.buffer = buffer
        self._sample_ids: list[str] = []  # listed for the next checkpoint (trained)
        self._entry_ids: list[str] = []  # listed for the next checkpoint (trained or dropped)
        self.unsettled: CommitIds | None = None  # what a written checkpoint covers, not yet settled
        self.waiters: list[asyncio.Future] = []
        self.last_checkpoint: str | None = None
        self.steps_since = 0  # learner steps trained since the last commit

    def settle_later(self, entry_ids: Iterable[str], sample_ids: Iterable[str] = ()) -> None:
        """Settle these stream entries (and mark these trained sample ids processed) once a checkpoint covers
        them: the next one written."""
        self._entry_ids.extend(entry_ids)
        self._sample_ids.extend(sample_ids)

    @property
    def pending(self) -> CommitIds:
        """The ids listed for the next checkpoint (a copy)."""
        return CommitIds(tuple(self._sample_ids), tuple(self._entry_ids))

    def carry_recorded(self, recorded: CommitIds) -> None:
        """The commit a resumed checkpoint recorded (``RunState.load_with_commit``) is settled next (``settle``)."""
        if recorded:
            self.unsettled = recorded

    def request(self) -> asyncio.Future:
        """A future resolved with ``{"step", "path"}`` once a checkpoint is written (at a step boundary)."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        return fut

    def due(self, step: int, every: int) -> bool:
        return step % every == 0 or bool(self.waiters)

    def needed_at_finish(self) -> bool:
        return bool(self.steps_since or self.waiters or self.last_checkpoint is None)

    async def commit(self, state: RunState, step: int, write_trainer: Callable[[Path], None],
                     settle: bool = True) -> None:
        """Write the checkpoint of ``step`` (``write_trainer(dir)`` saves the trainer there, ``state`` goes into
        ``run_state.json`` with the ids it covers), then settle it."""
        # an earlier commit that did not reach Redis is carried by this checkpoint too
        covered = (self.unsettled or CommitIds()) + self.pending
        self.unsettled = None
        self._sample_ids, self._entry_ids = [], []
        snapshot = state.to_json(covered)

        def write(tmp: Path) -> None:
            write_trainer(tmp / "trainer")
            (tmp / "run_state.json").write_text(snapshot)

        try:
            path = await asyncio.to_thread(self.ckpt.save, step, write)
        except BaseException:  # not written: what it would have covered goes to the next checkpoint
            self._sample_ids[:0], self._entry_ids[:0] = covered.sample_ids, covered.entry_ids
            raise
        self.unsettled = covered
        self.steps_since = 0
        self.last_checkpoint = str(path)
        log.info("checkpoint %s (acking %d entries)", path, len(covered.entry_ids))
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result({"step": step, "path": str(path)})
        if settle:
            await self.settle()

    async def settle(self) -> None:
        """Mark processed and ack what the latest checkpoint covers (idempotent: retried after an outage)."""
        if self.unsettled is None:
            return
        sample_ids, entry_ids = list(self.unsettled.sample_ids), list(self.unsettled.entry_ids)
        await self.processed.mark(sample_ids)
        await self.experiences.ack(entry_ids)
        self.unsettled = None
        self.buffer.release(sample_ids)
        self.lease.release(entry_ids)

    def fail_waiters(self, why: str) -> None:
        for fut in self.waiters:
            if not fut.done():
                fut.set_exception(RuntimeError(why))
