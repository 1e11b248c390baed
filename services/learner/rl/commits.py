"""The ack rule of an RL run: checkpoint, then settle exactly what the checkpoint covers.

At a commit the run state's commit lists (sample ids trained, stream entries trained or dropped since the
previous commit) are written into the checkpoint with the trainer; then the sample ids are marked processed
(``ProcessedIds``) and the entries XACKed. A commit whose settle did not reach Redis stays *unsettled*: it is
settled later (the loop retries after an outage), carried into the next checkpoint's lists, and settled on
resume from the checkpoint that recorded it, so a crash between the write and the acks loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from services.learner.checkpoint import CheckpointManager
from services.learner.rl.group_buffer import GroupBuffer
from services.learner.run_state import RunState
from shared.experience_queue import Lease, ProcessedIds, StreamQueue

log = logging.getLogger(__name__)


class Commits:
    """Checkpoints and their settles for one run; also the futures of ``/checkpoint`` requests."""

    def __init__(self, ckpt: CheckpointManager, processed: ProcessedIds, experiences: StreamQueue, lease: Lease,
                 buffer: GroupBuffer) -> None:
        self.ckpt = ckpt
        self.processed = processed
        self.experiences = experiences
        self.lease = lease
        self.buffer = buffer
        self.unsettled: tuple[list[str], list[str]] | None = None  # (sample ids, entry ids) of a written commit
        self.waiters: list[asyncio.Future] = []
        self.last_checkpoint: str | None = None
        self.steps_since = 0  # learner steps trained since the last commit

    def carry_recorded(self, state: RunState) -> None:
        """The commit a resumed checkpoint recorded (its lists in ``state``) is settled next (``settle``)."""
        if state.commit_entry_ids or state.commit_sample_ids:
            self.unsettled = (state.commit_sample_ids, state.commit_entry_ids)
            state.commit_sample_ids, state.commit_entry_ids = [], []

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
        """Write the checkpoint of ``step`` (``write_trainer(dir)`` saves the trainer there), then settle it."""
        if self.unsettled is not None:  # an earlier commit did not reach Redis: this checkpoint carries it too
            state.commit_sample_ids = self.unsettled[0] + state.commit_sample_ids
            state.commit_entry_ids = self.unsettled[1] + state.commit_entry_ids
            self.unsettled = None
        snapshot = state.to_json()

        def write(tmp: Path) -> None:
            write_trainer(tmp / "trainer")
            (tmp / "run_state.json").write_text(snapshot)

        path = await asyncio.to_thread(self.ckpt.save, step, write)
        self.unsettled = (state.commit_sample_ids, state.commit_entry_ids)
        state.commit_sample_ids, state.commit_entry_ids = [], []
        self.steps_since = 0
        self.last_checkpoint = str(path)
        log.info("checkpoint %s (acking %d entries)", path, len(self.unsettled[1]))
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
        sample_ids, entry_ids = self.unsettled
        await self.processed.mark(sample_ids)
        await self.experiences.ack(entry_ids)
        self.unsettled = None
        self.buffer.release(sample_ids)
        self.lease.release(entry_ids)

    def fail_waiters(self, why: str) -> None:
        for fut in self.waiters:
            if not fut.done():
                fut.set_exception(RuntimeError(why))
