"""``ToolCallStream`` reads the calls and content :func:`parse_tool_calls` reads from the whole text, however the
text is cut into pieces (a marker split anywhere never shows as content)."""

from __future__ import annotations

import random

import pytest

from services.rollout.agents.tool_calls import ToolCallStream, parse_tool_calls

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
TEXTS = ["hello", "  hi  ", CALL, "Let me.\n" + CALL, "Let me.\n" + CALL + "\n" + CALL + "\n", "x <tool",
         'a<tool_call>{"name": "f"}', CALL + "\nDone ", "\n" + CALL + "\n\nDone", "A " + CALL + " B", "", "   ",
         "<tool_c", "<tool_call>", "<<tool_call>" + CALL[len("<tool_call>"):], '<tool_call>{"name": broken}</tool_call>',
         'see <tool_call>{"name": 1}</tool_call> here']


def whole(text: str):
    parsed = parse_tool_calls(text)
    if not parsed.calls or parsed.errors:
        return text, []
    return parsed.content or None, [(c.name, c.arguments) for c in parsed.calls]


@pytest.mark.parametrize("text", TEXTS)
def test_any_cut_reads_as_the_whole_text(text):
    rng = random.Random(text)
    for _ in range(40):
        stream, content, calls = ToolCallStream(), "", []
        i = 0
        while i < len(text):
            n = rng.randint(1, 6)
            piece = stream.feed(text[i:i + n])
            assert "<tool_call>" not in piece.content or not piece.calls
            content, calls, i = content + piece.content, calls + piece.calls, i + n
        end = stream.close()
        content, calls = content + end.content, calls + end.calls
        assert (content or None if calls else content, [(c.name, c.arguments) for c in calls]) == whole(text)
        assert content == stream.content and calls == stream.calls


def test_a_marker_prefix_is_held_until_known():
    stream = ToolCallStream()
    assert stream.feed("hi <tool_").content == "hi"
    assert stream.feed("x").content == " <tool_x"


def test_each_call_stands_on_its_own_while_streaming():
    """The one difference from the whole-text parser: a readable call already sent stays a call when a later
    one is unreadable (that one is content)."""
    stream = ToolCallStream()
    first = stream.feed(CALL)
    later = stream.feed('<tool_call>{"name": </tool_call>')
    assert [c.name for c in first.calls] == ["add"] and later.content == '<tool_call>{"name": </tool_call>'
