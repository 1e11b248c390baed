"""The LLM-judge recipe's pieces (examples/sort-judge/): the judge's training rows (half right, half wrong, every
wrong answer differs from the reference) are asked in the very words the recipe's judge scorer sends, and the
recipe's specs load."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from deploy.local.sort_judge import JUDGE_TEMPLATE, judge_rows, wrong_answer
from deploy.local.sort_task import make_splits
from deploy.run.load import load_spec
from services.reward.scorers.judge_parsers import READERS
from services.reward.settings import RewardSettings

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "sort-judge"


def test_judge_rows_are_balanced_and_every_wrong_answer_is_wrong():
    train, _ = make_splits(0, 200)
    rows = judge_rows(train[:500], random.Random(0), passes=2)
    assert len(rows) == 2000 and sum(r["output"] == "1" for r in rows) == 1000
    for row in rows:
        ref, ans = row["input"].removeprefix("ref ").split(" ans ")
        assert row["input"] == JUDGE_TEMPLATE.format(label=ref, response=ans)
        assert (ans == ref) == (row["output"] == "1") and row["label"] == row["output"]
    rng = random.Random(1)
    wrong = {wrong_answer("1237", "3721", rng) for _ in range(2000)}
    assert "1237" not in wrong
    assert {"3721", "1273"} <= wrong and any(len(w) == 8 for w in wrong) and any(len(set(w)) == 1 for w in wrong)


def test_the_recipe_asks_the_judge_what_it_was_taught():
    spec = load_spec(RECIPE / "fleetrl.yaml")
    [scorer] = RewardSettings(scorers=spec.reward.scorers).scorers
    assert scorer.kind == "judge" and scorer.template == JUDGE_TEMPLATE
    reader = READERS[scorer.parser.type]
    assert reader.one(scorer.parser, "1") == 1.0 and reader.one(scorer.parser, "0") == 0.0


@pytest.mark.parametrize("name", ["sft.yaml", "judge-sft.yaml", "judge-eval.yaml", "exact.yaml", "fleetrl.yaml"])
def test_the_recipe_specs_load(name):
    assert load_spec(RECIPE / name).run_name.startswith("sort-judge")
