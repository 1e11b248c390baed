"""The id of one prompt attempt, which is also its group's id: ``e{epoch}-{index}`` for the first issue of dataset
position (epoch, index), ``e{epoch}-{index}-r{n}`` for its n-th re-issue. A sample id is the group id, ``#`` and
the sample's index in its group. One parser, one formatter: everything that reads these ids goes through
:class:`GroupId`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PATTERN = re.compile(r"e(\d+)-(\d+)(?:-r(\d+))?")


@dataclass(frozen=True, order=True)
class GroupId:
    """A prompt attempt: dataset position (``epoch``, ``index``) and re-issue number ``attempt`` (0: first)."""

    epoch: int
    index: int
    attempt: int = 0

    def __str__(self) -> str:
        return self.position if self.attempt == 0 else f"{self.position}-r{self.attempt}"

    @property
    def position(self) -> str:
        """``e{epoch}-{index}``: the dataset position every attempt of it shares."""
        return f"e{self.epoch}-{self.index}"

    def retry(self, attempt: int) -> GroupId:
        """The same position's ``attempt``-th issue."""
        return GroupId(self.epoch, self.index, attempt)

    @classmethod
    def parse(cls, text: str) -> GroupId | None:
        """The id ``text`` names, or None when it is not one of ours (a group id, or a sample id ``<group>#k``)."""
        m = _PATTERN.fullmatch(text.split("#", 1)[0])
        if m is None:
            return None
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
