"""shared/reward_api.py: what a /score reply's readers get from ScoreResponse.scored()."""

from __future__ import annotations

import pytest

from shared.reward_api import ScoreResponse


def test_scored_pairs_each_score_with_the_values_its_scorers_gave():
    reply = ScoreResponse(scores=[1.5, 0], components=[{"math": 1.0, "judge": None}, {}])
    assert reply.scored() == [(1.5, {"math": 1.0}), (0.0, {})]
    assert all(isinstance(s, float) for s, _ in reply.scored())


def test_scored_names_the_first_item_without_a_score():
    reply = ScoreResponse(scores=[1.0, None], components=[{"a": 1.0}, {"a": None}],
                          errors=[{"index": 1, "scorer": "a", "error": "down"}])
    with pytest.raises(ValueError, match=r"item 1 has no score \(1 marked failure"):
        reply.scored()
