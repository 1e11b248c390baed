"""Where a dataset position's life ends: trained, finished untrained (dynamic sampling) or given up, and a group
dropped on the way. Each changes the positions in flight and the group buffer together, so this one place keeps the
two in step: a position leaves the in-flight map (``RunState.in_flight``), its buffered groups leave the
:class:`GroupBuffer`, and their stream entries go to ``Commits`` (``settle_later``: acknowledged once a checkpoint
covers them).
"""

from __future__ import annotations

import logging

from services.learner.counters import Counters
from services.learner.rl.commits import SettleLater
from services.learner.rl.group_buffer import GroupBuffer, position_of
from services.learner.run_state import InFlight
from shared.schemas import Experience

log = logging.getLogger(__name__)


class Positions:
    """Ends positions in ``in_flight`` (the run's, keyed by position) and ``buffer``; records given-up ones in
    ``abandoned`` (position -> why); hands finished entries to ``commits``; counts with ``counters``."""

    def __init__(self, in_flight: dict[str, InFlight], abandoned: dict[str, str], buffer: GroupBuffer,
                 commits: SettleLater, counters: Counters) -> None:
        self.in_flight = in_flight
        self.abandoned = abandoned
        self.buffer = buffer
        self.commits = commits
        self.counters = counters

    def drop_group(self, gid: str) -> list[Experience]:
        """Drop one buffered group untrained; its entries are acknowledged at the next commit."""
        held = self.buffer.drop(gid)
        self.commits.settle_later([h.entry for h in held])
        return [h.exp for h in held]

    def trained(self, gids: list[str]) -> None:
        """The groups of a training step: their samples and entries go to the next commit, their positions are
        finished, and other attempts of those positions are superseded."""
        for gid in gids:
            key = position_of(gid)
            held = self.buffer.remove(gid)
            self.commits.settle_later([h.entry for h in held], [h.exp.id for h in held])
            del self.in_flight[key]
            self._drop_superseded(key)

    def finished_untrained(self, gid: str) -> None:
        """Dynamic sampling dropped complete group ``gid`` (no signal): its position is done without training."""
        key = position_of(gid)
        self.drop_group(gid)
        self._drop_superseded(key)
        del self.in_flight[key]

    def abandon(self, key: str, reason: str) -> None:
        """Give dataset position ``key`` up (its retries are spent): out of flight, with the reason, counted."""
        log.error("giving up dataset position %s: %s", key, reason)
        self.in_flight.pop(key, None)
        self.abandoned[key] = reason
        for gid in self.buffer.groups_of(key):
            self.drop_group(gid)
        self.counters.add("prompts_abandoned")

    def _drop_superseded(self, key: str) -> None:
        """Other attempts of a finished position: duplicates now."""
        for other in self.buffer.groups_of(key):
            self.counters.add("experiences_deduplicated", len(self.drop_group(other)))
