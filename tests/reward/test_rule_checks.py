"""Unit tests of the rule checks: answer extraction, numeric equivalence, format, length, and the scorer."""

from __future__ import annotations

import pytest

from services.reward.errors import InvalidItem
from services.reward.metrics import RewardMetrics
from services.reward.scorer_config import ExactCheck, FormatCheck, LengthCheck, MathCheck, RuleScorerConfig
from services.reward.scorers.answers import answers_equal, extract_answer, label_answer
from services.reward.scorers.rule import CHECKS, RuleScorer
from shared.reward_api import ScoreItem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is \boxed{42}.", "42"),
        (r"\boxed{1} then corrected: \boxed{\frac{3}{4}}", r"\frac{3}{4}"),
        (r"nested \boxed{\sqrt{x^{2}}} ok", r"\sqrt{x^{2}}"),
        (r"\fbox{7}", "7"),
        ("Natalia sold 48 clips... 48 + 24 = 72\n#### 72", "72"),
        ("#### 1,234\nextra line", "1,234"),
        ("I have 3 apples and 5 pears, total 8.", "8"),
        ("the value is -0.25", "-0.25"),
        ("ratio 3/4", "3/4"),
        ("no numbers here", None),
        (r"unclosed \boxed{12", "12"),  # falls back to the last number
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("0.5", "1/2", True),
        ("0.50", "1/2", True),
        ("0.5", "0.50", True),
        (r"\frac{1}{2}", "0.5", True),
        (r"\dfrac{1}{2}", "1/2", True),
        (r"\frac12", "0.5", True),
        (r"-\frac{3}{4}", "-0.75", True),
        ("1,000", "1000", True),
        ("10", "10.0", True),
        ("3.", "3", True),
        ("$5", "5", True),
        ("50%", "50", True),
        (r"\text{5}", "5", True),
        ("1e3", "1000", True),
        ("2", "3", False),
        ("0.333", "1/3", False),
        ("1/2", "x", False),
        ("x + 1", "x+1", True),
        (r"\sqrt{2}", r"\sqrt{2}", True),
        (None, "1", False),
    ],
)
def test_answers_equal(a, b, equal):
    assert answers_equal(a, b) is equal
    if a is not None:
        assert answers_equal(b, a) is equal


def test_relative_tolerance():
    assert not answers_equal("3.1416", "3.14159")
    assert answers_equal("3.1416", "3.14159", rel_tol=1e-4)


@pytest.mark.parametrize(
    ("label", "expected"),
    [(72, "72"), (0.5, "0.5"), ("#### 72", "72"), (r"\boxed{1/2}", "1/2"), ("  17 ", "17"), (None, None)],
)
def test_label_answer(label, expected):
    assert label_answer(label) == expected


def _item(response: str, label=None) -> ScoreItem:
    return ScoreItem(prompt="q", response=response, label=label)


@pytest.mark.parametrize(
    ("check", "response", "label", "value"),
    [
        (MathCheck(), r"... \boxed{0.50}", "1/2", 1.0),
        (MathCheck(), "#### 72", 72, 1.0),
        (MathCheck(), "The answer is 71", "72", 0.0),
        (MathCheck(), "no answer", "72", 0.0),
        (ExactCheck(), "  Paris ", "Paris", 1.0),
        (ExactCheck(case_sensitive=False), "paris", "Paris", 1.0),
        (ExactCheck(), "paris", "Paris", 0.0),
        (ExactCheck(extract_answer=True), r"it is \boxed{B}", "B", 1.0),
        (FormatCheck(pattern=r"<think>.*</think>"), "<think>\nhm\n</think> 4", None, 1.0),
        (FormatCheck(pattern=r"<think>.*</think>"), "4", None, 0.0),
        (FormatCheck(pattern=r"\d+", mode="fullmatch"), "42", None, 1.0),
        (FormatCheck(pattern=r"\d+", mode="fullmatch"), "42!", None, 0.0),
        (LengthCheck(max_length=10), "x" * 10, None, 0.0),
        (LengthCheck(max_length=10), "x" * 15, None, -0.5),
        (LengthCheck(max_length=10, penalty=2.0), "x" * 50, None, -2.0),
        (LengthCheck(max_length=2, unit="words"), "a b c", None, -0.5),
    ],
)
def test_checks(check, response, label, value):
    assert CHECKS[check.type](check, _item(response, label)) == pytest.approx(value)


def test_bad_regex_is_a_config_error():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        FormatCheck(pattern="(unclosed")


async def test_rule_scorer_needs_label_for_math():
    scorer = RuleScorer(RuleScorerConfig(name="m", check=MathCheck()), RewardMetrics())
    assert await scorer.score([_item("#### 3", "3"), _item("#### 4", "3")]) == [1.0, 0.0]
    with pytest.raises(InvalidItem, match="item 1: .*needs a `label`"):
        await scorer.score([_item("#### 3", "3"), _item("#### 3")])
