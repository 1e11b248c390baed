"""How a mini-batch is cut into micro-batches (forward/backward passes of gradient accumulation).

- By count (``train.micro_batch_size``): consecutive slices of ``n`` rows, whatever their lengths; a
  short sample padded to the longest one in its slice pays for its neighbours.
- By token budget (``train.micro_batch_tokens``, as verl's dynamic batch size): rows sorted by length
  and packed greedily so that each micro-batch's padded size — rows x its longest row — stays within the
  budget; long samples share a pass with few others, short ones with many. A row longer than the budget
  is a micro-batch of its own.

Either way the loss of a mini-batch is the same (its denominators are the mini-batch's totals), so the
split changes speed and memory, never the update.
"""

from __future__ import annotations

from collections.abc import Sequence


def by_count(n_rows: int, size: int) -> list[list[int]]:
    """Positions ``0 .. n_rows-1`` in consecutive slices of ``size``."""
    return [list(range(start, min(start + size, n_rows))) for start in range(0, n_rows, size)]


def by_token_budget(lengths: Sequence[int], budget: int, max_rows: int | None = None) -> list[list[int]]:
    """Positions of ``lengths`` grouped so that ``len(group) * max(lengths in group) <= budget`` (and at most
    ``max_rows`` rows), longest rows first. Every position appears exactly once."""
    if budget < 1:
        raise ValueError("budget must be at least one token")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = max(int(lengths[i]), 1)
        width = max(longest, length)
        fits = (len(current) + 1) * width <= budget and (max_rows is None or len(current) < max_rows)
        if current and not fits:
            groups.append(current)
            current, width = [], length
        current.append(i)
        longest = width
    if current:
        groups.append(current)
    return groups
