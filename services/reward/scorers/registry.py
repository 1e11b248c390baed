"""Scorer kind -> implementing class, through the scorer plug-in point
(:data:`services.reward.scorer_config.SCORERS`). Modules load lazily, so torch is imported only when an
``hf_rm`` scorer is configured."""

from __future__ import annotations

from services.reward.metrics import RewardMetrics
from services.reward.scorer_config import SCORERS
from services.reward.scorers.base import Scorer


def scorer_class(kind: str) -> type[Scorer]:
    """The scorer class registered for ``kind`` (imported on first use)."""
    return SCORERS.load(kind)


def build_scorer(config, metrics: RewardMetrics) -> Scorer:
    """The scorer for one validated scorer config (its ``kind`` picks the class): ``cls(config, metrics)``."""
    return scorer_class(config.kind)(config, metrics)
