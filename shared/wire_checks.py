"""Checks every HTTP request model shares: numbers an engine can hold, text that is valid UTF-8.

Importable without torch. Used by :mod:`shared.generate_api` (rollout) and :mod:`shared.reward_api`.

- Numbers are strict: a JSON string is never turned into a number (``"10"`` is refused where an int is
  declared), a float is never truncated into an int; an int is still accepted where a float is declared
  (``temperature: 1``, as real clients send). Floats are finite (no ``Infinity`` / ``NaN``).
- Integers have bounds the engines' tensors hold: token ids and token counts fit int32, seeds fit int64.
- Text must be encodable as UTF-8. JSON can carry a lone surrogate (``"\\ud800"``), which Python decodes
  into a ``str`` no tokenizer, JSON encoder or HTTP client can encode: refused at the door, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AllowInfNan, BaseModel, Strict, StrictBool, StrictInt, field_validator

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SEED_MAX = INT64_MAX
"""Largest seed accepted (int64, what vLLM's and SGLang's seeds hold); sample ``j`` of ``n`` uses a seed derived
from it that stays in range."""

FiniteFloat = Annotated[float, Strict(), AllowInfNan(False)]
"""A JSON number (int or float) that is finite; never a string."""

__all__ = ["INT32_MAX", "INT64_MAX", "SEED_MAX", "FiniteFloat", "StrictBool", "StrictInt", "Utf8Fields", "check_token_ids",
           "invalid_text", "printable"]


def _surrogate(s: str) -> str | None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"lone surrogate U+{ord(s[exc.start]):04X} at character {exc.start}"
    return None


def printable(text: object) -> str:
    """``str(text)`` with unpaired surrogates escaped (``\\ud800``): safe to put in an error reply, which must be
    encodable as UTF-8 even when it quotes the bad input (an unknown field's name, say)."""
    return str(text).encode("utf-8", "backslashreplace").decode()


def invalid_text(value: Any) -> str | None:
    """Where ``value`` (a str, or lists / dicts / models holding them, keys included) has text that is not
    valid UTF-8: ``"[2].text: lone surrogate U+D800 at character 0"``; None when all of it is valid.
    Iterative, so a deeply nested JSON value cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            problem = _surrogate(v)
            if problem:
                return f"{path}: {problem}" if path else problem
            continue
        if isinstance(v, BaseModel):
            v = v.__dict__
        if isinstance(v, Mapping):
            items = []
            for k, item in v.items():
                sub = f"{path}.{printable(k)}" if path else printable(k)
                if isinstance(k, str) and _surrogate(k):
                    return f"{sub} (the key): {_surrogate(k)}"
                items.append((sub, item))
            stack.extend(reversed(items))
        elif isinstance(v, (list, tuple)):
            if v and all(type(x) is int for x in v):
                continue  # token ids: nothing to check
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(v))))
    return None


class Utf8Fields(BaseModel):
    """Base of request models: every field given, at any depth, holds only valid UTF-8 text.

    A nested model in a union (a chat message's content parts) should not derive from it: the field that
    holds it reports the problem with its path, which keeps the error to one line naming the field.
    """

    @field_validator("*")
    @classmethod
    def _valid_utf8(cls, value: Any) -> Any:
        problem = invalid_text(value)
        if problem:
            raise ValueError(f"text is not valid UTF-8 ({problem}); send the text itself, not unpaired surrogates")
        return value


def check_token_ids(value: Any, field: str, *, nested: bool) -> Any:
    """A ``mode="before"`` check of token ids (a list of ints, or with ``nested`` a list of such lists): each
    a JSON integer in ``0..INT32_MAX``. Anything else passes through to the field's own validation."""
    if not isinstance(value, list) or not value or isinstance(value[0], str):
        return value
    rows = value if nested and isinstance(value[0], list) else [value]
    for r, row in enumerate(rows):
        if not isinstance(row, list):
            continue
        for i, t in enumerate(row):
            if type(t) is not int or not 0 <= t <= INT32_MAX:
                where = f"[{r}][{i}]" if rows is value else f"[{i}]"
                raise ValueError(f"`{field}`{where} is {t!r}: token ids are integers in 0..{INT32_MAX}")
    return value
