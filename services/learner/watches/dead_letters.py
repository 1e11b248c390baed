"""What the run owner does with its run's dead letters, so it never waits on work that only sits in a
dead-letter stream.

Dead-lettered prompts and experiences of the run are followed (:class:`~.queue_watch.DeadLetterWatch`, polled at
most once a second): their prompt is re-issued at once, and after ``rollout.dead_letter_retries`` of them the
dataset position is given up with the reason (``prompts_abandoned``). A prompt a worker dead-lettered as one that
can never succeed (reason ``permanent: ...``, in a dead letter signed by the fleet) is given up at once, not
re-issued.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from services.learner.data import parse_item_id
from services.learner.rl.group_buffer import GroupBuffer
from services.learner.run_state import InFlight
from services.learner.watches.queue import DeadLetter, DeadLetterWatch
from shared.experience_queue import PERMANENT

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0
"""Seconds between two reads of the dead-letter streams (the loop turns far more often)."""


class DeadLetterHandler:
    """Re-issues (``reissue(position, why)``: ``PromptFeeder.reissue``) or gives up (``abandon(position, why)``:
    ``Positions.abandon``) the positions of ``in_flight`` whose entries ``watch`` finds dead-lettered; the watch's
    cursors are copied into ``cursors`` after each poll (``RunState.dead_letter_cursors``: saved in checkpoints)."""

    def __init__(self, watch: DeadLetterWatch, in_flight: dict[str, InFlight], cursors: dict[str, str],
                 buffer: GroupBuffer, reissue: Callable[[str, str], Awaitable[bool]],
                 abandon: Callable[[str, str], None], retries: int) -> None:
        self.watch = watch
        self.in_flight = in_flight
        self.cursors = cursors
        self.buffer = buffer
        self.reissue = reissue
        self.abandon = abandon
        self.retries = retries  # rollout.dead_letter_retries
        self._next_poll = 0.0

    async def poll(self) -> None:
        """Handle the dead letters that came since the last poll (none when polled within the interval)."""
        if time.monotonic() < self._next_poll:
            return
        self._next_poll = time.monotonic() + POLL_INTERVAL_S
        for dl in await self.watch.poll():
            await self.handle(dl)
        self.cursors.clear()
        self.cursors.update(self.watch.cursors)

    async def handle(self, dl: DeadLetter) -> None:
        gid = dl.group_id or ""
        parsed = parse_item_id(gid) if gid else None
        if parsed is None:
            log.warning("dead letter %s in %s belongs to no prompt of this run (%s)", dl.entry, dl.stream, dl.reason)
            return
        key, attempt = parsed
        item = self.in_flight.get(key)
        if item is None or item.attempt != attempt or self.buffer.is_complete(gid):
            return  # trained, re-issued already, or complete without the dead-lettered copy
        item.dead_letters += 1
        if dl.reason.startswith(PERMANENT):  # the worker knows it can never succeed: issuing it again cannot help
            self.abandon(key, f"{dl.stream} entry dead-lettered as one that can never succeed: {dl.reason}")
            return
        if item.dead_letters > self.retries:
            self.abandon(key, f"{dl.stream} entry dead-lettered {item.dead_letters} times; last: {dl.reason}")
            return
        log.warning("prompt %s: its %s entry was dead-lettered (%s); re-issuing it", dl.group_id, dl.stream, dl.reason)
        await self.reissue(key, f"dead-lettered: {dl.reason}")
