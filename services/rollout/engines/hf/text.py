"""Incremental detokenisation with stop strings (pure Python; used per sequence by the hf engine).

Decoding uses the prefix/read-offset method (as vLLM and TGI do): each step decodes only a short
window of ids, and text ending in an incomplete UTF-8 sequence (U+FFFD) is held until it completes.
Text that could still be the start of a stop string is held back from streaming until it is known
not to be, so a streamed client never sees part of a stop string.
"""

from __future__ import annotations

from typing import Any


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


class IncrementalText:
    """The text of one growing sequence of token ids, with stop-string detection."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool, stops: tuple[str, ...], no_stop_trim: bool) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stops = tuple(s for s in stops if s)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._no_stop_trim = no_stop_trim
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._emitted = 0
        self.text = ""
        self.matched: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)

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
        hit = find_stop(self.text, self._stops, start) if self._stops else None
        if hit is None:
            return None
        pos, stop = hit
        self.text = self.text[: pos + len(stop)] if self._no_stop_trim else self.text[:pos]
        self.matched = stop
        return stop

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
