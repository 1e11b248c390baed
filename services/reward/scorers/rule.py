"""Rule-based verifiers: exact match, math answer match, regex format check, length penalty.

Each check type is a pure function ``(check config, item) -> float`` found through ``CHECKS``.

Responses are written by the policy being trained, so a response must not be able to make a check
expensive: answers parse within bounds (``answers.py``), a format pattern runs under the ``regex`` module's
own timeout (which frees the GIL while it matches; a response that the pattern cannot decide in
``match_timeout_s`` does not have the format: 0.0), and the checks run in the scorer's own threads, never on
the event loop, so ``/health`` and other requests keep being answered while a large batch is checked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import regex

from services.reward.errors import InvalidItem
from services.reward.scorer_config import ExactCheck, FormatCheck, LengthCheck, MathCheck
from services.reward.scorers.answers import answers_equal, extract_answer, label_answer
from services.reward.scorers.base import Scorer
from shared.reward_api import ScoreItem


def _need_label(item: ScoreItem, check: str) -> str:
    answer = label_answer(item.label)
    if answer is None:
        raise InvalidItem(f"the `{check}` rule needs a `label` (the ground truth); this item has none")
    return answer


def exact_match(check: ExactCheck, item: ScoreItem) -> float:
    expected = _need_label(item, "exact")
    given = extract_answer(item.response) if check.extract_answer else item.response
    if given is None:
        return 0.0
    if check.strip:
        given, expected = given.strip(), expected.strip()
    if not check.case_sensitive:
        given, expected = given.casefold(), expected.casefold()
    return 1.0 if given == expected else 0.0


def math_match(check: MathCheck, item: ScoreItem) -> float:
    expected = _need_label(item, "math")
    return 1.0 if answers_equal(extract_answer(item.response), expected, check.rel_tol) else 0.0


def format_match(check: FormatCheck, item: ScoreItem) -> float:
    pattern = _compiled(check.pattern, regex.DOTALL if check.dotall else 0)
    match = pattern.fullmatch if check.mode == "fullmatch" else pattern.search
    try:
        found = match(item.response, timeout=check.match_timeout_s)
    except TimeoutError:  # catastrophic backtracking on this response: it did not show the format
        return 0.0
    return 1.0 if found else 0.0


def length_penalty(check: LengthCheck, item: ScoreItem) -> float:
    length = len(item.response) if check.unit == "chars" else len(item.response.split())
    excess = max(0, length - check.max_length)
    if excess == 0:
        return 0.0
    return -check.penalty * min(1.0, excess / check.max_length)


_PATTERNS: dict[tuple[str, int], regex.Pattern] = {}


def _compiled(pattern: str, flags: int) -> regex.Pattern:
    key = (pattern, flags)
    if key not in _PATTERNS:
        _PATTERNS[key] = regex.compile(pattern, flags)
    return _PATTERNS[key]


CHECKS: dict[str, Callable[..., float]] = {
    "exact": exact_match,
    "math": math_match,
    "format": format_match,
    "length": length_penalty,
}


class RuleScorer(Scorer):
    """Applies one rule check to each item, in the scorer's threads (bounded work, off the event loop)."""

    kind = "rule"
    threads = 2
    """Threads per rule scorer: checks are pure python (the GIL), so more would not check faster."""

    def __init__(self, config, metrics):
        super().__init__(config, metrics)
        self._check = CHECKS[config.check.type]
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix=f"reward-{self.name}")

    async def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.score_now, items)

    def score_now(self, items: Sequence[ScoreItem]) -> list[float]:
        """The values, computed in the calling thread."""
        values = []
        for index, item in enumerate(items):
            try:
                values.append(self._check(self.config.check, item))
            except InvalidItem as exc:
                raise InvalidItem(f"item {index}: {exc}") from exc
        return values
