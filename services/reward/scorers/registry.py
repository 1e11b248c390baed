"""Scorer kind -> implementing class. Modules load lazily, so torch is imported only when an
``hf_rm`` scorer is configured."""

from __future__ import annotations

from services.reward.metrics import RewardMetrics
from services.reward.scorers.base import Scorer
from shared.service_kit.loader import load_object

SCORER_CLASSES: dict[str, str] = {
    "rule": "services.reward.scorers.rule:RuleScorer",
    "hf_rm": "services.reward.scorers.hf_rm:HfRmScorer",
    "python": "services.reward.scorers.python_fn:PythonScorer",
    "http": "services.reward.scorers.http_remote:HttpScorer",
}


def scorer_class(kind: str) -> type[Scorer]:
    return load_object(SCORER_CLASSES[kind], Scorer, what=f"scorer kind {kind!r}")


def build_scorer(config, metrics: RewardMetrics) -> Scorer:
    """The scorer for one validated scorer config (its ``kind`` picks the class)."""
    return scorer_class(config.kind)(config, metrics)
