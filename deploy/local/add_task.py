"""A second small verifiable task: add two numbers below 100 ("add 37+45=" -> "82"), exact-answer reward.

The same shape as :mod:`deploy.local.sort_task` (rows with ``input``, ``output`` and ``label``; disjoint train and
held-out splits), so benchmarks do not rest on sorting alone: answers of one to three digits, and a carry to learn.
"""

from __future__ import annotations

import random


def problem(a: int, b: int) -> dict[str, str]:
    answer = str(a + b)
    return {"input": f"add {a}+{b}=", "output": answer, "label": answer}


def make_splits(seed: int = 0, heldout: int = 200) -> tuple[list[dict], list[dict]]:
    """All 10^4 pairs of numbers 0-99, shuffled; the first ``heldout`` are the held-out set."""
    every = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(every)
    rows = [problem(a, b) for a, b in every]
    return rows[heldout:], rows[:heldout]
