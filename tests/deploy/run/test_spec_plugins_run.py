"""``fleetrl run`` with a scorer of the operator's own, registered by a module beside the spec and named in the
spec's ``plugins``: the spec validates with it, the reward service imports the same module (the spec's folder on
its sys.path) and scores with it, and the learner trains on its rewards."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.run.conftest import tiny_spec
from tests.deploy.run.test_fleetrl_run import fleetrl_run, metrics

pytestmark = [pytest.mark.slow, pytest.mark.process]  # a whole `fleetrl run` fleet (~40-60 s)

SCORER = '''
from typing import Literal

from pydantic import Field

from services.reward.scorer_config import SCORERS, ScorerSettingsBase
from services.reward.scorers.base import Scorer


class PenaltySettings(ScorerSettingsBase):
    kind: Literal["penalty_run_test"] = "penalty_run_test"
    per_char: float = Field(default=-1.0, lt=0, description="Reward per character of the response (negative).")


class PenaltyScorer(Scorer):
    async def score(self, items):
        return [self.config.per_char * len(item.response) - 0.125 for item in items]


SCORERS.register("penalty_run_test", PenaltySettings, PenaltyScorer)
'''


def test_a_scorer_in_a_file_beside_the_spec_scores_the_run(tmp_path, tiny_model_dir):
    (tmp_path / "my_scorer.py").write_text(SCORER)
    spec_file = tiny_spec(tmp_path, tiny_model_dir, plugins=["my_scorer"], eval={},
                          reward={"scorers": [{"name": "penalty", "kind": "penalty_run_test", "per_char": -0.25}]})
    run = fleetrl_run(spec_file)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]
    # only the plug-in gives negative rewards (each -0.125 - 0.25 x characters); built-in rule scores are 0 or 1
    assert all(m["reward_mean"] < 0 for m in metrics(run_dir)), metrics(run_dir)
    for name in ("reward-0", "rollout-0", "learner"):
        cfg = yaml.safe_load((run_dir / "configs" / f"{name}.yaml").read_text())
        assert cfg["plugins"] == ["my_scorer"] and cfg["sys_path"] == [str(tmp_path.resolve())], name
