"""Incremental detokenisation and stop strings (services/rollout/engines/hf/text.py)."""

from __future__ import annotations

import pytest

from deploy.local.tiny_model import build_tokenizer
from services.rollout.engines.hf.text import IncrementalText, find_stop, holdback


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_holdback_and_find_stop():
    assert holdback("hello wor", ("world",)) == 3
    assert holdback("hello", ("xyz",)) == 0
    assert holdback("abab", ("abc", "bab!")) == 3
    assert find_stop("one two three", ("three", "two"), 0) == (4, "two")
    assert find_stop("one two", ("three",), 0) is None


def test_multibyte_characters_are_held_until_complete(tok):
    ids = tok.encode("héllo ✓")
    text = IncrementalText(tok, True, (), False)
    pieces = []
    for t in ids:
        text.push(t)
        pieces.append(text.take_visible(final=False))
    text.flush()
    pieces.append(text.take_visible(final=True))
    assert "".join(pieces) == "héllo ✓"
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_trims_and_is_never_streamed(tok):
    ids = tok.encode("answer: 42\n\nnext")
    text = IncrementalText(tok, True, ("\n\n",), False)
    streamed, matched = [], None
    for t in ids:
        matched = text.push(t)
        streamed.append(text.take_visible(final=matched is not None))
        if matched:
            break
    assert matched == "\n\n"
    assert text.text == "answer: 42" and "".join(streamed) == "answer: 42"


def test_no_stop_trim_keeps_the_stop_string(tok):
    text = IncrementalText(tok, True, ("END",), True)
    for t in tok.encode("abcEND more"):
        if text.push(t):
            break
    assert text.text == "abcEND"
