"""Scorer kind -> implementing class. Modules load lazily, so torch is imported only when an
``hf_rm`` scorer is configured."""

from __future__ import annotations

import importlib

from services.reward.metrics import RewardMetrics
from services.reward.scorers.base import Scorer

SCORER_CLASSES: dict[str, str] = {
    "rule": "services.reward.scorers.rule:RuleScorer",
    "hf_rm": "services.reward.scorers.hf_rm:HfRmScorer",
    "python": "services.reward.scorers.python_fn:PythonScorer",
    "http": "services.reward.scorers.http_remote:HttpScorer",
}


def scorer_class(kind: str) -> type[Scorer]:
    module, _, name = SCORER_CLASSES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def build_scorer(config, metrics: RewardMetrics) -> Scorer:
    """The scorer for one validated scorer config (its ``kind`` picks the class)."""
    return scorer_class(config.kind)(config, metrics)
