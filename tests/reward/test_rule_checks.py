"""Unit tests of the rule checks: answer extraction, numeric equivalence, format, length, and the scorer;
what a response can make a check cost is bounded, and checks run off the event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.reward.errors import InvalidItem
from services.reward.metrics import RewardMetrics
from services.reward.scorer_config import ExactCheck, FormatCheck, LengthCheck, MathCheck, RuleScorerConfig
from services.reward.scorers.answers import answers_equal, extract_answer, label_answer
from services.reward.scorers.rule import CHECKS, RuleScorer, format_match, math_match
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
    await scorer.start()
    assert await scorer.score([_item("#### 3", "3"), _item("#### 4", "3")]) == [1.0, 0.0]
    with pytest.raises(InvalidItem, match="item 1: .*needs a `label`"):
        await scorer.score([_item("#### 3", "3"), _item("#### 3")])
    await scorer.close()


# --- what a response can make a check cost (the policy writes the response) ---------------------------


@pytest.mark.parametrize(
    "answer",
    ["1e9999999", "-2.5E+9999999", "1e-9999999", r"\frac{1e9999999}{7}", "3/1e9999999", "1" * 5000,
     "1" + "0" * 600, "1,000" * 200],
)
def test_numbers_beyond_the_bounds_are_not_numbers_and_cost_nothing(answer):
    """Fraction("1e9999999") computes 10**9999999 (seconds; 1e999999999 never ends): beyond the bounds an
    answer is not a number, so it is simply not equal to the label."""
    start = time.process_time()  # CPU time: the bound is on work, not on a loaded machine's clock
    for label in ("1", "7"):
        assert math_match(MathCheck(), _item(rf"\boxed{{{answer}}}", label)) == 0.0
        assert math_match(MathCheck(rel_tol=1e-3), _item(rf"\boxed{{{answer}}}", label)) == 0.0
    assert time.process_time() - start < 0.5


def test_numbers_within_the_bounds_still_compare_exactly():
    assert answers_equal("1e1000", "10e999") and answers_equal("1e-1000", "0.1e-999")
    assert not answers_equal("1e1000", "1e999")
    # rel_tol compares exactly: float() of 1e400 overflows (it was an OverflowError, a failed scorer call)
    assert answers_equal("1e400", "1.0000001e400", rel_tol=1e-6)
    assert not answers_equal("1e400", "1.1e400", rel_tol=1e-6)
    assert answers_equal("1e9999999", "1e9999999")  # beyond the bounds both are text, and equal as text


def test_a_backtracking_format_pattern_is_bounded_per_response():
    """The example format pattern (rules_only.yaml) on many unclosed boxes backtracks quadratically."""
    check = FormatCheck(pattern=r"\\boxed\{.+\}", match_timeout_s=0.2)
    start = time.process_time()  # CPU time: the bound is on work, not on a loaded machine's clock
    assert format_match(check, _item("\\boxed{" * 100_000)) == 0.0
    assert time.process_time() - start < 2.0
    assert format_match(check, _item("so \\boxed{4}")) == 1.0


async def test_rule_checks_run_off_the_event_loop():
    """A batch whose checks take a while leaves the event loop free (it answers /health meanwhile)."""
    scorer = RuleScorer(RuleScorerConfig(name="m", check=MathCheck()), RewardMetrics())
    await scorer.start()
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    start = time.monotonic()
    values = await scorer.score([_item("1 " * 200_000, "1")] * 10)
    took = time.monotonic() - start
    await asyncio.sleep(0.05)  # the ticker records the gap that spans the batch, if there was one
    tick.cancel()
    await scorer.close()
    assert values == [1.0] * 10
    assert max(gaps) < max(0.5, took / 3), f"the loop stalled {max(gaps):.2f}s of a {took:.2f}s batch"
