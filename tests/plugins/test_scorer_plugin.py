"""A third-party scorer: registered with its settings model (a ScorerSettingsBase), configured in the reward
settings' ``scorers`` list, and scoring /score through the reward service's scorer builder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pytest
from fastapi.testclient import TestClient
from pydantic import Field

from services.reward.scorer_config import SCORERS, ScorerSettingsBase
from services.reward.scorers.base import Scorer
from services.reward.settings import RewardSettings
from shared.reward_api import ScoreItem
from shared.settings import SettingsError, load_settings


class VowelSettings(ScorerSettingsBase):
    """Counts vowels in the response, times ``per_vowel``."""

    kind: Literal["vowels_test"] = "vowels_test"
    per_vowel: float = Field(default=1.0, gt=0, description="Reward per vowel.")


class VowelScorer(Scorer):
    kind = "vowels_test"

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        return [self.config.per_vowel * sum(c in "aeiou" for c in item.response) for item in items]


def test_a_registered_scorer_is_configured_and_scores_through_the_reward_service(registered):
    from services.reward.app import create_app

    config = {"scorers": [{"name": "v", "kind": "vowels_test", "per_vowel": 0.5}], "auth_token": "t" * 24}
    with pytest.raises(SettingsError, match=r"unknown scorer kind 'vowels_test'; known: 'rule', 'hf_rm', 'python', 'http'"):
        load_settings(RewardSettings, **config)
    registered(SCORERS, "vowels_test", VowelSettings, VowelScorer)
    with pytest.raises(SettingsError, match=r"scorers.0.per_vowel: Input should be greater than 0"):
        load_settings(RewardSettings, scorers=[{"name": "v", "kind": "vowels_test", "per_vowel": 0}])
    settings = load_settings(RewardSettings, **config)
    assert isinstance(settings.scorers[0], VowelSettings)
    with TestClient(create_app(settings)) as client:
        out = client.post("/score", headers={"Authorization": f"Bearer {'t' * 24}"},
                          json={"items": [{"prompt": "q", "response": "banana"}, {"prompt": "q", "response": "xyz"}]})
        assert out.status_code == 200, out.text
        assert out.json()["scores"] == [1.5, 0.0] and out.json()["components"] == [{"v": 1.5}, {"v": 0.0}]


def test_an_implementation_that_is_not_a_scorer_fails_when_the_service_builds_it(registered):
    from services.reward.service import RewardService
    from shared.service_kit.loader import LoadError

    registered(SCORERS, "vowels_test", VowelSettings, "tests.plugins.test_scorer_plugin:VowelSettings")
    settings = RewardSettings(scorers=[{"name": "v", "kind": "vowels_test"}])
    with pytest.raises(LoadError, match="scorer 'vowels_test'.*not a subclass of Scorer"):
        RewardService(settings)
