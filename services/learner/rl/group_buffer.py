"""Experiences on their way into a training step: filed by prompt group, deduplicated, checked for staleness,
filtered for signal and taken as a batch. Pure (no I/O, no clock): the run owner hands it what it consumed and
acts on what it answers (which stream entries to acknowledge, which prompts to re-issue).

A group id is the prompt attempt ``e{epoch}-{index}[-r{n}]`` (:func:`~services.learner.data.parse_item_id`); the
dataset position ``e{epoch}-{index}`` is its *key*. Two attempts of one position can both complete (a late first
attempt and its re-issue): a batch takes at most one group per position, and training one supersedes the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum

from services.learner.data import parse_item_id
from shared.schemas import Experience


class Filed(StrEnum):
    """What :meth:`GroupBuffer.file` did with an experience."""

    HELD = "held"  # buffered; its group is still incomplete
    COMPLETED = "completed"  # buffered, and its group is now complete
    DUPLICATE = "duplicate"  # not buffered: the sample is held already or its position is not in flight


@dataclass(frozen=True)
class Held:
    entry: str  # stream entry id (acknowledged at the commit after the group is trained or dropped)
    exp: Experience


def position_of(group_id: str) -> str:
    parsed = parse_item_id(group_id)
    return parsed[0] if parsed is not None else ""


def zero_variance(rewards: Iterable[float], tol: float = 1e-9) -> bool:
    """Every reward of the group equal (within ``tol``): group-relative advantages are all zero, no signal."""
    rs = list(rewards)
    return not rs or max(rs) - min(rs) <= tol


class GroupBuffer:
    def __init__(self) -> None:
        self._groups: dict[str, dict[int, Held]] = {}  # group id -> sample index -> held
        self._complete: deque[str] = deque()  # complete group ids, oldest first
        self._samples: set[str] = set()  # sample ids buffered, or trained and not yet committed

    # ---- filing ------------------------------------------------------------------------------------
    def file(self, entry: str, e: Experience, in_flight: Collection[str]) -> Filed:
        """Buffer one experience (already checked valid and not yet processed) of a position in ``in_flight``."""
        if e.id in self._samples or position_of(e.group_id) not in in_flight:
            return Filed.DUPLICATE
        group = self._groups.setdefault(e.group_id, {})
        if e.index in group:  # the position is filled (a second trajectory of one session slot): keep the first
            return Filed.DUPLICATE
        group[e.index] = Held(entry, e)
        self._samples.add(e.id)
        if len(group) == e.group_size:
            self._complete.append(e.group_id)
            return Filed.COMPLETED
        return Filed.HELD

    # ---- reading -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._groups)

    @property
    def complete(self) -> list[str]:
        return list(self._complete)

    def is_complete(self, gid: str) -> bool:
        return gid in self._complete

    def experiences(self, gid: str) -> list[Experience]:
        """The group's samples in index order."""
        return [h.exp for _, h in sorted(self._groups[gid].items())]

    def oldest_version(self, gid: str) -> int:
        """The weight version of the group's oldest token (``weight_version`` is each sample's oldest span)."""
        return min(h.exp.weight_version for h in self._groups[gid].values())

    def groups_of(self, key: str) -> list[str]:
        return [g for g in self._groups if position_of(g) == key]

    # ---- leaving -----------------------------------------------------------------------------------
    def remove(self, gid: str) -> list[Held]:
        """Take a group out (trained, or dropped): its samples stay counted as held until :meth:`release`
        when trained; a dropped group's samples are released at once by :meth:`drop`."""
        if gid in self._complete:
            self._complete.remove(gid)
        return [h for _, h in sorted(self._groups.pop(gid, {}).items())]

    def drop(self, gid: str) -> list[Held]:
        """Take a group out without training it; its samples may come again (another attempt's copies)."""
        held = self.remove(gid)
        self._samples.difference_update(h.exp.id for h in held)
        return held

    def release(self, sample_ids: Iterable[str]) -> None:
        """Trained samples are now recorded as processed (in Redis): stop holding their ids."""
        self._samples.difference_update(sample_ids)

    # ---- choosing ------------------------------------------------------------------------------------
    def stale(self, min_version: int) -> list[str]:
        """Complete groups holding a token older than ``min_version``."""
        return [g for g in self._complete if self.oldest_version(g) < min_version]

    def without_signal(self) -> list[str]:
        """Complete groups whose rewards are all equal (DAPO's dynamic sampling drops these)."""
        return [g for g in self._complete if zero_variance(h.exp.reward for h in self._groups[g].values())]

    def take(self, want: int, in_flight: Collection[str], exhausted: bool) -> list[str]:
        """Up to ``want`` complete groups, at most one per dataset position, oldest first, or [] while a full
        batch is not there yet. When the data is exhausted, a smaller last batch is taken once every position
        still in flight has a complete group."""
        batch: list[str] = []
        positions: set[str] = set()
        for gid in self._complete:
            key = position_of(gid)
            if key not in positions and len(batch) < want:
                batch.append(gid)
                positions.add(key)
        ready = len(batch) >= want or (exhausted and bool(batch) and positions >= set(in_flight))
        return batch if ready else []
