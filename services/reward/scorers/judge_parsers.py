"""The judge's text -> scores (pure functions), one reader per parser type, found through ``READERS``.

Each reader has ``one(parser, text) -> float`` (pointwise, pairwise) and ``many(parser, text, n, ranking) ->
list`` (group mode: ``n`` scores, or with ``ranking`` the response numbers best first). A reply they cannot
read raises :class:`Unreadable` (the scorer asks again, up to ``max_retries``). A value outside the parser's
``[min, max]`` is unreadable too: whatever a judged response talks the judge into, the score stays in range.

The judge's reply is bounded before it is read (``MAX_REPLY_CHARS``) and every pattern here is linear in it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.reward.judge_config import BoxedParser, JsonParser, LabelParser, NumberParser
from services.reward.scorers.answers import _last_braced

MAX_REPLY_CHARS = 65_536
"""Only this much of a judge's reply is read (its end is kept: verdicts come last)."""
MAX_JSON_STARTS = 64
"""At most this many ``{`` positions are tried as the start of the reply's JSON object."""

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d{1,3})?")
_LIST_SPLIT = re.compile(r"\s*(?:,|;|>|\s)\s*")


class Unreadable(ValueError):
    """The parser cannot read a score from the judge's reply."""


def _excerpt(text: str) -> str:
    return repr(text[:120] + ("..." if len(text) > 120 else ""))


def in_range(parser, value: float, text: str) -> float:
    """``value`` checked against the parser's range (normalized to [0, 1] when it says so)."""
    if not math.isfinite(value) or not parser.min <= value <= parser.max:
        raise Unreadable(f"score {value} is outside [{parser.min}, {parser.max}] in the judge's reply {_excerpt(text)}")
    return (value - parser.min) / (parser.max - parser.min) if parser.normalize else value


def _number(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError as exc:
        raise Unreadable(f"{text.strip()[:60]!r} is not a number") from exc


# --- number -------------------------------------------------------------------------------------------------


def number_one(parser: NumberParser, text: str) -> float:
    if parser.pattern is not None:
        found = [m.group(1) for m in re.finditer(parser.pattern, text)]
    else:
        found = _NUMBER.findall(text)
    if not found:
        raise Unreadable(f"no score in the judge's reply {_excerpt(text)}")
    return in_range(parser, _number(found[-1]), text)


def _numbered(pairs: list[tuple[str, str]], n: int, text: str) -> dict[int, str]:
    by_index: dict[int, str] = {}
    for k, value in pairs:  # a judge that restates a line: its last word counts
        by_index[int(k)] = value
    missing = [k for k in range(1, n + 1) if k not in by_index]
    if missing:
        raise Unreadable(f"no score for response(s) {missing} of {n} in the judge's reply {_excerpt(text)}")
    return by_index


def number_many(parser: NumberParser, text: str, n: int, ranking: bool) -> list[float]:
    pairs = [(m.group(1), m.group(2)) for m in re.finditer(parser.pattern_many, text)]
    by_index = _numbered(pairs, n, text)
    return [in_range(parser, _number(by_index[k]), text) for k in range(1, n + 1)]


# --- json ---------------------------------------------------------------------------------------------------


def _json_object(text: str) -> dict:
    decoder = json.JSONDecoder()
    at = text.find("{")
    tries = 0
    while at != -1 and tries < MAX_JSON_STARTS:
        try:
            value, _ = decoder.raw_decode(text, at)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        tries += 1
        at = text.find("{", at + 1)
    raise Unreadable(f"no JSON object in the judge's reply {_excerpt(text)}")


def _field(parser: JsonParser, text: str) -> Any:
    value: Any = _json_object(text)
    for key in parser.field.split("."):
        if not isinstance(value, dict) or key not in value:
            raise Unreadable(f"the judge's JSON has no field {parser.field!r}: {_excerpt(text)}")
        value = value[key]
    return value


def _json_number(parser, value: Any, text: str) -> float:
    if isinstance(value, bool):
        value = 1.0 if value else 0.0
    if isinstance(value, str):
        value = _number(value)
    if not isinstance(value, (int, float)):
        raise Unreadable(f"field {parser.field!r} is {value!r}, not a number, in the judge's reply {_excerpt(text)}")
    return in_range(parser, float(value), text)


def json_one(parser: JsonParser, text: str) -> float:
    return _json_number(parser, _field(parser, text), text)


def json_many(parser: JsonParser, text: str, n: int, ranking: bool) -> list[float]:
    value = _field(parser, text)
    if not isinstance(value, list) or len(value) != n:
        raise Unreadable(f"field {parser.field!r} should be a list of {n} values: {_excerpt(text)}")
    if ranking:
        return [float(_int(v, text)) for v in value]
    return [_json_number(parser, v, text) for v in value]


def _int(value: Any, text: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str, float)):
        raise Unreadable(f"{value!r} is not a response number in the judge's reply {_excerpt(text)}")
    try:
        number = float(value)
    except ValueError as exc:
        raise Unreadable(f"{value!r} is not a response number in the judge's reply {_excerpt(text)}") from exc
    if not number.is_integer():
        raise Unreadable(f"{value!r} is not a response number in the judge's reply {_excerpt(text)}")
    return int(number)


# --- boxed --------------------------------------------------------------------------------------------------


def _boxed(text: str) -> str:
    content = _last_braced(text, "boxed")
    if content is None:
        raise Unreadable(f"no \\boxed{{...}} in the judge's reply {_excerpt(text)}")
    return content.strip()


def _verdict(parser: BoxedParser, word: str, text: str) -> float:
    if not parser.map:
        return in_range(parser, _number(word), text)
    lowered = {k.lower(): v for k, v in parser.map.items()}
    if word.lower() not in lowered:
        raise Unreadable(f"verdict {word[:60]!r} is none of {sorted(parser.map)}")
    return lowered[word.lower()]


def boxed_one(parser: BoxedParser, text: str) -> float:
    return _verdict(parser, _boxed(text), text)


def boxed_many(parser: BoxedParser, text: str, n: int, ranking: bool) -> list[float]:
    words = [w for w in _LIST_SPLIT.split(_boxed(text)) if w]
    if len(words) != n:
        raise Unreadable(f"\\boxed{{...}} should hold {n} values, holds {len(words)}: {_excerpt(text)}")
    if ranking:
        return [float(_int(w, text)) for w in words]
    return [_verdict(parser, w, text) for w in words]


# --- labels -------------------------------------------------------------------------------------------------


def _labels_pattern(parser: LabelParser) -> re.Pattern:
    words = sorted(parser.map, key=len, reverse=True)  # the longest first: "incorrect" before "correct"
    flags = 0 if parser.case_sensitive else re.IGNORECASE
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(w) for w in words) + r")(?!\w)", flags)


def _label_value(parser: LabelParser, word: str) -> float:
    if parser.case_sensitive:
        return parser.map[word]
    return {k.lower(): v for k, v in parser.map.items()}[word.lower()]


def labels_one(parser: LabelParser, text: str) -> float:
    found = _labels_pattern(parser).findall(text)
    if not found:
        raise Unreadable(f"none of the verdicts {sorted(parser.map)} in the judge's reply {_excerpt(text)}")
    return _label_value(parser, found[-1])


def labels_many(parser: LabelParser, text: str, n: int, ranking: bool) -> list[float]:
    words = _labels_pattern(parser).pattern
    flags = 0 if parser.case_sensitive else re.IGNORECASE
    line = re.compile(r"(?m)^\W*(?:response|sample)?\s*#?\s*(\d+)\s*\W*\s*[:=\-]\s*" + words, flags)
    by_index = _numbered([(m.group(1), m.group(2)) for m in line.finditer(text)], n, text)
    return [_label_value(parser, by_index[k]) for k in range(1, n + 1)]


@dataclass(frozen=True)
class Reader:
    one: Callable[[Any, str], float]
    many: Callable[[Any, str, int, bool], list[float]]


#: parser type -> its reader
READERS: dict[str, Reader] = {
    "number": Reader(number_one, number_many),
    "json": Reader(json_one, json_many),
    "boxed": Reader(boxed_one, boxed_many),
    "labels": Reader(labels_one, labels_many),
}


def bounded(text: str) -> str:
    """The part of a reply that is read."""
    return text if len(text) <= MAX_REPLY_CHARS else text[-MAX_REPLY_CHARS:]


# --- group results -> rewards (pure) ------------------------------------------------------------------------


def ranking_rewards(order: list[float], n: int) -> list[float]:
    """Rewards from a ranking (response numbers from 1, best first): 1.0 for the best down to 0.0 for the worst,
    evenly spaced (1.0 for a group of one). Not a permutation of 1..n: :class:`Unreadable`."""
    ranks = [int(k) for k in order]
    if sorted(ranks) != list(range(1, n + 1)):
        raise Unreadable(f"ranking {ranks} is not an order of the responses 1..{n}")
    if n == 1:
        return [1.0]
    rewards = [0.0] * n
    for place, k in enumerate(ranks):
        rewards[k - 1] = 1.0 - place / (n - 1)
    return rewards


def win_rates(n: int, prefer: dict[tuple[int, int], float]) -> list[float]:
    """Each response's mean chance of beating the others, from ``prefer[(i, j)]`` = chance that ``i`` beats
    ``j`` (i < j; ``j`` beats ``i`` with 1 - that). A group of one: 0.5."""
    if n == 1:
        return [0.5]
    total = [0.0] * n
    for (i, j), p in prefer.items():
        total[i] += p
        total[j] += 1.0 - p
    return [t / (n - 1) for t in total]
