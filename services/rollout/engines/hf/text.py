"""Incremental detokenisation with stop strings (pure Python; used per sequence by the hf engine).

Decoding uses the prefix/read-offset method (as vLLM and TGI do): each step decodes only a short
window of ids, and text ending in an incomplete UTF-8 sequence (U+FFFD) is held until it completes.
Text that could still be the start of a stop string is held back from streaming until it is known
not to be, so a streamed client never sees part of a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import regex


def holdback(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def find_stop(text: str, stops: tuple[str, ...], start: int) -> tuple[int, str] | None:
    """Earliest (position, stop string) of a stop string in ``text`` at or after ``start``."""
    found: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop, start)
        if pos >= 0 and (found is None or pos < found[0]):
            found = (pos, stop)
    return found


@dataclass(frozen=True)
class StopRegex:
    """Stop patterns (compiled with the ``regex`` module) and the bounds of their search: a search looks at the
    last ``window`` characters of the text and gives up after ``timeout_s`` (the sequence then ends, naming it)."""

    patterns: tuple[regex.Pattern, ...]
    window: int
    timeout_s: float

    @classmethod
    def of(cls, patterns: Sequence[str], window: int, timeout_s: float) -> StopRegex | None:
        return cls(tuple(regex.compile(p) for p in patterns), window, timeout_s) if patterns else None

    def find(self, text: str, start: int) -> tuple[int, int, str] | None:
        """Earliest (start, end, pattern) of a non-empty match in ``text`` at or after ``start``."""
        found: tuple[int, int, str] | None = None
        for pattern in self.patterns:
            try:
                m = pattern.search(text, start, timeout=self.timeout_s)
            except TimeoutError:
                raise ValueError(f"stop_regex {pattern.pattern[:60]!r} could not be searched within "
                                 f"{self.timeout_s} s (limits.stop_regex_timeout_s)") from None
            if m is not None and m.end() > m.start() and (found is None or m.start() < found[0]):
                found = (m.start(), m.end(), pattern.pattern)
        return found


class IncrementalText:
    """The text of one growing sequence of token ids, with stop-string and stop-regex detection. While ``armed``
    is False (fewer tokens than ``min_new_tokens``), nothing stops it."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool, stops: tuple[str, ...], no_stop_trim: bool,
                 stop_regex: StopRegex | None = None, spaces_between_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stops = tuple(s for s in stops if s)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._regex = stop_regex
        self._no_stop_trim = no_stop_trim
        self._decode_kwargs = {} if spaces_between_special_tokens else {"spaces_between_special_tokens": False}
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._emitted = 0
        self.text = ""
        self.matched: str | None = None
        self.armed = True

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False,
                                **self._decode_kwargs)

    def push(self, token_id: int) -> str | None:
        """Add one token; returns the stop string it completed, if any (the text is then final)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None
        self._prefix, self._read = self._read, len(self._ids)
        return self._append(new_text[len(prefix_text) :])

    def _append(self, delta: str) -> str | None:
        start = max(0, len(self.text) - self._max_stop + 1)
        self.text += delta
        if not self.armed:
            return None
        hit = find_stop(self.text, self._stops, start) if self._stops else None
        if hit is not None:
            pos, stop = hit
            self.text = self.text[: pos + len(stop)] if self._no_stop_trim else self.text[:pos]
            self.matched = stop
            return stop
        if self._regex is not None:
            found = self._regex.find(self.text, max(0, len(self.text) - self._regex.window))
            if found is not None:  # SGLang's finish names the pattern; the text is trimmed at the match
                pos, end, pattern = found
                self.text = self.text[:end] if self._no_stop_trim else self.text[:pos]
                self.matched = pattern
                return pattern
        return None

    def flush(self) -> None:
        """At the end of the sequence: take in any text still held for an incomplete character."""
        if self.matched is not None:
            return
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text):
            self._prefix, self._read = self._read, len(self._ids)
            self._append(new_text[len(prefix_text) :])

    def take_visible(self, final: bool) -> str:
        """Text not yet handed out that is safe to show (all of it when ``final``)."""
        end = len(self.text)
        if not final and self.matched is None:
            end -= holdback(self.text, self._stops)
        out = self.text[self._emitted : end] if end > self._emitted else ""
        self._emitted = max(self._emitted, end)
        return out
