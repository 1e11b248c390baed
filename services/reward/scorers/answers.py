"""Answer extraction and equivalence for math verifiers (pure functions).

``extract_answer``: the last ``\\boxed{...}`` (nested braces allowed), else the text after the last
``####`` (GSM8K), else the last number in the text, else None.

``answers_equal``: numbers compare as exact fractions after light normalisation (thousands commas,
``$``, ``%``, ``\\frac{a}{b}``, ``\\text{}``, a trailing period), so "0.5" == "1/2" == "0.50"; anything
that is not a number compares as normalised text (whitespace and ``\\left``/``\\right`` removed).

Responses are written by the policy being trained, so every parse is bounded: a number longer than
``MAX_NUMBER_CHARS`` or with an exponent beyond ``MAX_EXPONENT`` is not a number (it compares as text), and
every regular expression here runs in time linear in the text. ``Fraction("1e999999999")`` would compute
10**999999999.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_NUMBER_CHARS = 512
"""A numeric answer longer than this (commas, spaces, signs, ``/`` included) is not parsed as a number."""
MAX_EXPONENT = 1000
"""A numeric answer whose exponent is beyond +-this is not parsed as a number (10**1000 is still cheap)."""

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")
_LAST_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")
_DECIMAL = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE](?P<exp>[-+]?\d+))?")
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


def _decimal(text: str) -> Fraction | None:
    """``text`` (no commas) as an exact number, or None; the exponent is checked before ``Fraction`` sees it."""
    m = _DECIMAL.fullmatch(text.strip())
    if m is None:
        return None
    exp = m.group("exp")
    if exp is not None and abs(int(exp)) > MAX_EXPONENT:
        return None
    return Fraction(m.group(0))


def to_number(text: str) -> Fraction | None:
    """Parse a normalised answer as an exact number, or None (also when it is beyond the bounds above)."""
    if len(text) > 8 * MAX_NUMBER_CHARS:  # wrappers (\\text{}, $, spaces) included: no number is this long
        return None
    s = _normalise(text)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    negative = False
    if s.startswith(("-(", "+(")):
        negative, s = s[0] == "-", s[1:]
    s = re.sub(r"^\(([^()]*)\)/\(([^()]*)\)$", r"\1/\2", s)
    if not s or len(s) > MAX_NUMBER_CHARS or not _NUMBER.fullmatch(s) or not any(c.isdigit() for c in s):
        return None
    num, _, den = s.replace(",", "").partition("/")
    value = _decimal(num)
    if den:
        divisor = _decimal(den)
        if value is None or divisor is None or divisor == 0:
            return None
        value /= divisor
    if value is None:
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
        # exact, as math.isclose: float() of a bounded number can still overflow (1e999)
        return abs(a - b) <= Fraction(rel_tol) * max(abs(a), abs(b))
    if (a is None) != (b is None):
        return False
    return _normalise(given) == _normalise(expected)
