"""Answer extraction and equivalence for math verifiers (pure functions).

``extract_answer``: the last ``\\boxed{...}`` (nested braces allowed), else the text after the last
``####`` (GSM8K), else the last number in the text, else None.

``answers_equal``: numbers compare as exact fractions after light normalisation (thousands commas,
``$``, ``%``, ``\\frac{a}{b}``, ``\\text{}``, a trailing period), so "0.5" == "1/2" == "0.50"; anything
that is not a number compares as normalised text (whitespace and ``\\left``/``\\right`` removed).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")
_LAST_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


def _last_braced(text: str, command: str) -> str | None:
    """Content of the last ``\\command{...}`` in ``text``, with nested braces; None if absent/unclosed."""
    start = text.rfind("\\" + command)
    while start != -1:
        i = start + len(command) + 1
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
            return None
        start = text.rfind("\\" + command, 0, start)
    return None


def extract_answer(text: str) -> str | None:
    """The final answer in a model's response, or None when there is none."""
    for command in ("boxed", "fbox"):
        boxed = _last_braced(text, command)
        if boxed is not None:
            return boxed.strip()
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        if tail:
            return tail.splitlines()[0].strip()
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


def label_answer(label: object) -> str | None:
    """The ground-truth answer in a label: numbers as they are; strings with ``\\boxed``/``####`` extracted."""
    if label is None:
        return None
    if isinstance(label, bool):
        return str(label)
    if isinstance(label, (int, float, Fraction)):
        return str(label)
    text = str(label).strip()
    if "\\boxed" in text or "\\fbox" in text or "####" in text:
        return extract_answer(text)
    return text


def _normalise(text: str) -> str:
    s = text.strip()
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if s.startswith("{") and s.endswith("}") and s.count("{") == 1:
        s = s[1:-1]
    return s


def to_number(text: str) -> Fraction | None:
    """Parse a normalised answer as an exact number, or None."""
    s = _normalise(text)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    negative = False
    if s.startswith(("-(", "+(")):
        negative, s = s[0] == "-", s[1:]
    s = re.sub(r"^\(([^()]*)\)/\(([^()]*)\)$", r"\1/\2", s)
    if not s or not _NUMBER.fullmatch(s) or not any(c.isdigit() for c in s):
        return None
    s = s.replace(",", "")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            value = Fraction(num) / Fraction(den)
        else:
            value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return -value if negative else value


def answers_equal(given: str | None, expected: str | None, rel_tol: float = 0.0) -> bool:
    """Whether two extracted answers are equivalent (numbers by value, other text after normalisation)."""
    if given is None or expected is None:
        return False
    a, b = to_number(given), to_number(expected)
    if a is not None and b is not None:
        if rel_tol == 0.0:
            return a == b
        return math.isclose(float(a), float(b), rel_tol=rel_tol)
    if (a is None) != (b is None):
        return False
    return _normalise(given) == _normalise(expected)
