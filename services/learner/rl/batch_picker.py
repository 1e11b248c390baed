"""Which complete groups the next training step takes.

**Staleness.** A complete group holding a token older than ``current - max_staleness`` (a sample's
``weight_version`` is its oldest token's, partial rollouts included) is dropped (counted) and its prompt
re-issued under a new attempt id (``e{epoch}-{index}-r{n}``), so no prompt is lost. With
``rollout.stale_hold_s`` no step is taken while such a position's new group is on its way (bounded): a prompt that
scores slower than ``max_staleness`` steps of a learner fed by faster ones would otherwise go stale on every
attempt. Dedupe is by sample id
(ProcessedIds for committed ones, the :class:`GroupBuffer` for held ones) and by dataset position (a
position already trained takes no more groups).

**Dynamic sampling** (``algorithm.dynamic_sampling``, DAPO): a complete group whose rewards are all equal is
dropped and its dataset position finished untrained, so the window feeds a fresh prompt in its place; at most
``max_refills_per_step`` per step, after which such groups are trained (counted).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from services.learner.counters import Counters
from services.learner.data import parse_item_id
from services.learner.rl.group_buffer import GroupBuffer, position_of
from services.learner.rl.positions import Positions
from services.learner.run_state import InFlight
from services.learner.settings import LearnerSettings

log = logging.getLogger(__name__)
STARVED_AFTER = 3  # stale drops of one prompt before the run says how to stop it starving


class PickState(Protocol):
    """What the picker reads of the run state (``RunState`` is one): the version the fleet was last given (what
    staleness counts from) and the positions in flight (it notes their stale drops)."""

    @property
    def weight_version(self) -> int: ...

    @property
    def in_flight(self) -> dict[str, InFlight]: ...


class BatchPicker:
    """Takes a step's groups from ``buffer``; ``reissue(position, reason)`` issues a stale group's prompt again."""

    def __init__(self, state: PickState, buffer: GroupBuffer, positions: Positions, settings: LearnerSettings,
                 counters: Counters, reissue: Callable[[str, str], Awaitable[bool]]) -> None:
        self.state = state
        self.buffer = buffer
        self.positions = positions
        self.s = settings
        self.counters = counters
        self.reissue = reissue
        self.refills = 0  # groups dropped by dynamic sampling since the last training step
        self.warned_starved = False

    async def take(self, exhausted: bool) -> list[str]:
        """Up to groups_per_step fresh complete groups (dropping stale ones, and with dynamic sampling those
        without signal), or [] if not ready. ``exhausted``: every prompt of the run was issued (the last, smaller
        batch may go)."""
        limit = self.state.weight_version - self.s.run.max_staleness
        for gid in self.buffer.stale(limit):
            oldest = self.buffer.oldest_version(gid)
            dropped = self.positions.drop_group(gid)
            self.counters.add("experiences_dropped_stale", len(dropped))
            parsed = parse_item_id(gid)
            assert parsed is not None  # a buffered group is of a position in flight (GroupBuffer.file)
            key, attempt = parsed
            log.info("dropped stale group %s (version %d < %d); re-issuing", gid, oldest, limit)
            item = self.state.in_flight.get(key)
            # (not re-issued, or given up, already)
            if item is not None and item.attempt == attempt and \
                    await self.reissue(key, f"stale group (weight version {oldest} < {limit})"):
                item.stale_drops += 1
                self._warn_if_starved(key, item.stale_drops)
        if self.s.algorithm.dynamic_sampling.enabled:
            self._filter_without_signal()
        if self.held_for() is not None:
            return []
        return self.buffer.take(self.s.train.groups_per_step, self.state.in_flight, exhausted)

    def held_for(self) -> str | None:
        """A position whose group went stale and whose re-issued group is not complete yet, re-issued less than
        ``rollout.stale_hold_s`` ago: no step is taken until it lands (or the hold runs out), so a prompt that
        scores slower than ``max_staleness`` steps is trained, not re-issued until ``max_attempts``."""
        hold = self.s.rollout.stale_hold_s
        if hold <= 0:
            return None
        complete = {position_of(g) for g in self.buffer.complete}
        now = time.time()
        return next((key for key, item in self.state.in_flight.items()
                     if item.stale_drops and now - item.issued_at < hold and key not in complete), None)

    def holding(self) -> str | None:
        """Why the steps wait, while a hold (``held_for``) keeps them: for ``/status`` and the ``fleetrl run`` display,
        which would otherwise show a running learner that does not step."""
        key = self.held_for()
        if key is None:
            return None
        left = self.s.rollout.stale_hold_s - (time.time() - self.state.in_flight[key].issued_at)
        return (f"prompt {key} went stale and is being generated again: the steps wait for it "
                f"(rollout.stale_hold_s {self.s.rollout.stale_hold_s:g}s, {max(left, 0.0):.0f}s left)")

    def _warn_if_starved(self, key: str, drops: int) -> None:
        """Once a run: a prompt that went stale STARVED_AFTER times is slower to generate and score than the
        learner's steps (a slow verifier, a long answer) and will keep going stale until it is given up; say which
        settings change that, since nothing else does."""
        if drops < STARVED_AFTER or self.warned_starved or self.s.rollout.stale_hold_s > 0:
            return
        self.warned_starved = True
        log.warning("prompt %s went stale %d times: its groups take longer to generate and score than %d training "
                    "steps, so each attempt arrives too old and it will be given up after rollout.max_attempts; set "
                    "rollout.stale_hold_s (e.g. 30) to hold the steps until it lands, or raise "
                    "run.max_staleness", key, drops, self.s.run.max_staleness + 1)

    def stepped(self) -> None:
        """A training step took its batch: the next step has its own refills."""
        self.refills = 0

    def _filter_without_signal(self) -> None:
        """Dynamic sampling: finish the positions of zero-variance groups untrained (the window then feeds fresh
        prompts), up to the step's refill cap; past the cap they stay and are trained."""
        cap = self.s.algorithm.dynamic_sampling.max_refills_per_step
        for gid in self.buffer.without_signal():
            if self.refills >= cap:
                self.counters.add("dynamic_sampling_cap_reached")
                return
            self.positions.finished_untrained(gid)
            self.refills += 1
            self.counters.add("groups_filtered")
