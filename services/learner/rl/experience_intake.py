"""Experiences in: consume the run's experiences stream (group "learner") and file what may be trained.

Each delivery is held on the lease at once (renewed until the commit that acknowledges it), then checked in
order: issued by this learner (its grant, ``grants.py``), valid for the model (token ids inside the vocabulary,
length inside the positions, finite logprobs and reward), new (sample id neither committed nor held). What fails a
check is counted and handed to ``Commits`` (acknowledged at the next commit); the rest is filed in the group buffer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import numpy as np

from services.learner.counters import Counters
from services.learner.rl.commits import SettleLater
from services.learner.rl.grants import unissued
from services.learner.rl.group_buffer import Filed, GroupBuffer
from services.learner.run_state import InFlight
from services.learner.settings import LearnerSettings
from shared.experience_queue import Delivery, Lease, ProcessedIds, StreamQueue
from shared.schemas import Experience

log = logging.getLogger(__name__)


def invalid_reason(e: Experience, vocab: int, max_len: int | None) -> str | None:
    """Why experience ``e`` cannot be trained on a model of ``vocab`` token ids and ``max_len`` positions, or None."""
    length = len(e.prompt_token_ids) + len(e.response_token_ids)
    if max_len is not None and length > max_len:
        return f"{length} tokens exceed the model's {max_len} positions"
    for name in ("prompt_token_ids", "response_token_ids"):
        ids = np.asarray(getattr(e, name))
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            return f"{name} holds ids outside the vocabulary [0, {vocab})"
    if not np.isfinite(np.asarray(e.response_logprobs, dtype=np.float64)).all() or not math.isfinite(e.reward):
        return "non-finite logprob or reward"
    return None


class ExperienceIntake:
    """Consumes and admits experiences into ``buffer``; ``limits`` are the trainer's model's (vocabulary size,
    positions or None). It reads the run's positions ``in_flight`` and checks grants under ``grant_key``; what it
    drops goes to ``commits``."""

    def __init__(self, experiences: StreamQueue, processed: ProcessedIds, lease: Lease,
                 in_flight: Mapping[str, InFlight], grant_key: str, buffer: GroupBuffer, commits: SettleLater,
                 limits: tuple[int, int | None], settings: LearnerSettings, counters: Counters) -> None:
        self.experiences = experiences
        self.processed = processed
        self.lease = lease
        self.in_flight = in_flight
        self.grant_key = grant_key
        self.buffer = buffer
        self.commits = commits
        self.s = settings
        self.counters = counters
        self.limits = limits

    async def receive(self) -> None:
        """One consume call (blocks up to ``queue.block_ms``), then admit what came."""
        q = self.s.queue
        before = self.experiences.rejected_signature
        deliveries = await self.experiences.consume(q.consumer, count=q.consume_count, block_ms=q.block_ms)
        unsigned = self.experiences.rejected_signature - before
        if unsigned:  # dead-lettered by the queue before decoding (shared/signing.py)
            self.counters.add("experiences_unsigned", unsigned)
        await self.admit(deliveries)

    async def admit(self, deliveries: list[Delivery[Experience]]) -> None:
        fresh = [d for d in deliveries if d.id not in self.lease.held]  # held already (replayed history)
        if not fresh:
            return
        new = set(await self.processed.filter_new([d.record.id for d in fresh]))
        for d in fresh:
            e = d.record
            self.lease.hold([d.id])
            self.counters.add("experiences_consumed")
            problem = unissued(e, self.in_flight, self.grant_key, self.s.rollout.group_size)
            if problem is not None:
                log.warning("dropping experience %s: %s", e.id, problem)
                self.counters.add("experiences_unissued")
                self.commits.settle_later([d.id])
                continue
            problem = invalid_reason(e, *self.limits)
            if problem is not None:
                log.warning("rejecting experience %s: %s", e.id, problem)
                self.counters.add("experiences_rejected")
                self.commits.settle_later([d.id])  # its prompt is re-issued when the group times out
                continue
            if e.id not in new or self.buffer.file(d.id, e, self.in_flight) is Filed.DUPLICATE:
                self.counters.add("experiences_deduplicated")
                self.commits.settle_later([d.id])
