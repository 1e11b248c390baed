"""What the online preference algorithms take from a batch of complete groups (pure, no torch).

- :func:`best_and_worst` (online DPO): a group's best- and worst-scored samples form a pair when their scores
  differ by ``min_gap`` or more. Ties are broken by position (the first sample of the top score is the chosen,
  the first of the bottom score the rejected): deterministic, so a replayed step after a resume picks the same
  pair. A group whose scores are all equal, or closer than ``min_gap``, gives no pair (rLLM / NeMo-RL's rule).
- :func:`best_above` (rejection sampling): a group's best sample when its score reaches ``threshold``.

Dynamic sampling (``algorithm.dynamic_sampling``) drops zero-variance groups before a step is formed
(:mod:`services.learner.rl.batch_picker`); the groups that reach these functions may still hold no pair (a gap
below ``min_gap``) and are then left out of the step's loss, counted in its metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pick:
    group: int  # index of the group in the batch
    chosen: int  # sample index within the group
    rejected: int | None  # None for rejection sampling (one sample kept)
    gap: float  # chosen score - rejected score (rejection sampling: the chosen score)


def best_and_worst(scores: Sequence[float], min_gap: float) -> tuple[int, int] | None:
    """(index of the best, index of the worst) of one group's scores, or None without a gap of ``min_gap``."""
    if len(scores) < 2:
        return None
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    if scores[best] - scores[worst] < min_gap:
        return None
    return best, worst


def best_above(scores: Sequence[float], threshold: float) -> int | None:
    """Index of one group's best sample (the first of ties) when its score is at least ``threshold``."""
    if not scores:
        return None
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return best if scores[best] >= threshold else None


def dpo_picks(groups: Sequence[Sequence[float]], min_gap: float) -> list[Pick]:
    """A pair from every group that has one (in batch order)."""
    out = []
    for g, scores in enumerate(groups):
        pick = best_and_worst(scores, min_gap)
        if pick is not None:
            out.append(Pick(g, pick[0], pick[1], scores[pick[0]] - scores[pick[1]]))
    return out


def rejection_picks(groups: Sequence[Sequence[float]], threshold: float) -> list[Pick]:
    """The best sample of every group whose best reaches ``threshold`` (in batch order)."""
    out = []
    for g, scores in enumerate(groups):
        best = best_above(scores, threshold)
        if best is not None:
            out.append(Pick(g, best, None, scores[best]))
    return out
