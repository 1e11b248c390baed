"""Learning-rate schedules (multipliers of the peak LR) by name: linear warmup, then cosine, linear or constant."""

from __future__ import annotations

import math
from collections.abc import Callable

Schedule = Callable[[int], float]


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float) -> Schedule:
    """``step/warmup`` during warmup, then cosine from 1 down to ``min_ratio`` at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def warmup_linear(total_steps: int, warmup_steps: int, min_ratio: float) -> Schedule:
    """``step/warmup`` during warmup, then a straight line from 1 down to ``min_ratio`` at ``total_steps``
    (Hugging Face's ``linear`` with ``min_ratio`` 0)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 1.0 - (1.0 - min_ratio) * progress

    return factor


def warmup_constant(total_steps: int, warmup_steps: int, min_ratio: float) -> Schedule:
    def factor(step: int) -> float:
        return (step + 1) / (warmup_steps + 1) if step < warmup_steps else 1.0

    return factor


SCHEDULES: dict[str, Callable[[int, int, float], Schedule]] = {
    "cosine": warmup_cosine,
    "linear": warmup_linear,
    "constant": warmup_constant,
}
