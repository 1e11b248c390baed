"""Tool calls in the model's own text format, parsed into OpenAI ``tool_calls``.

Chat templates that support tools render a model's call as text, and the model writes it back the same
way. The formats are registered by name (:data:`TOOL_CALL_FORMATS`); a model that does not follow one
exactly — broken JSON, no ``name``, arguments that are not an object — gets a :class:`ToolCallError`,
which a multi-turn rollout turns into an error observation the model sees (never an exception that ends
the rollout).

- ``hermes`` (Qwen2.5 / Qwen3, Hermes, many fine-tunes): ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>``, one block per call, anywhere in the turn.

:class:`ToolCallStream` reads the same calls out of text that arrives piece by piece (OpenAI streaming).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ToolCallError(ValueError):
    """The model tried to call a tool but the call cannot be read; the message is shown to the model."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry (arguments as a JSON string, as OpenAI sends them)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class ParsedTurn:
    content: str  # the text outside the calls
    calls: list[ToolCall]
    errors: list[str]  # calls that could not be read, with why (each becomes an error observation)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _call_from_json(raw: str) -> ToolCall:
    text = raw.strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"the tool call is not valid JSON ({exc.msg} at character {exc.pos}): {text[:200]}") from exc
    if not isinstance(obj, dict):
        raise ToolCallError(f"a tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallError("the tool call has no 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models send OpenAI's string form
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"the arguments of {name!r} are not valid JSON: {exc.msg}") from exc
    if not isinstance(args, dict):
        raise ToolCallError(f"the arguments of {name!r} must be a JSON object, got {type(args).__name__}")
    return ToolCall(name=name, arguments=args)


def parse_hermes(text: str) -> ParsedTurn:
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in _HERMES.finditer(text):
        try:
            calls.append(_call_from_json(match.group(1)))
        except ToolCallError as exc:
            errors.append(str(exc))
    content = _HERMES.sub("", text).strip()
    return ParsedTurn(content=content, calls=calls, errors=errors)


def render_hermes(calls: list[ToolCall]) -> str:
    """The calls as the model writes them (for SFT transcripts and tests)."""
    return "".join(f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>" for c in calls)


TOOL_CALL_FORMATS: dict[str, Callable[[str], ParsedTurn]] = {"hermes": parse_hermes}
#: each format's (start, end) markers of one call, for reading calls while the text streams
TOOL_CALL_MARKERS: dict[str, tuple[str, str]] = {"hermes": ("<tool_call>", "</tool_call>")}


def parse_tool_calls(text: str, fmt: str = "hermes") -> ParsedTurn:
    if fmt not in TOOL_CALL_FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; known: {sorted(TOOL_CALL_FORMATS)}")
    return TOOL_CALL_FORMATS[fmt](text)


@dataclass
class StreamedPiece:
    content: str  # text to show now
    calls: list[ToolCall]  # calls complete now


class ToolCallStream:
    """Tool calls read out of one reply's text as it streams, with the same parser as :func:`parse_tool_calls`.

    Text streams as content until a call's start marker appears; text that may be the start of the marker is
    held back, so the marker never shows as content. The call's text is held until its end marker (or the end
    of the reply: an unterminated last call is read as the whole-text parser reads it), then parsed on its own:
    a readable call is handed out as a :class:`ToolCall`, an unreadable one as content, verbatim.

    Whitespace follows the whole-text parser, which strips the content around calls: whitespace at the end of
    the content so far is held until more content follows, and dropped at the end of a reply that made calls;
    whitespace before the first content is dropped once a call was made. (One difference remains: the
    whole-text parser keeps every call as content when any call in the reply is unreadable, which a stream
    cannot do for calls it already sent; here each call stands on its own, as in vLLM's streaming parsers.)
    """

    def __init__(self, fmt: str = "hermes") -> None:
        if fmt not in TOOL_CALL_MARKERS:
            raise ValueError(f"tool-call format {fmt!r} has no streaming markers; known: {sorted(TOOL_CALL_MARKERS)}")
        self.fmt = fmt
        self.start, self.end = TOOL_CALL_MARKERS[fmt]
        self.calls: list[ToolCall] = []  # every call handed out so far
        self.content = ""  # every piece of content handed out so far
        self._buf = ""  # text not yet handed out (a possible marker start, or a call's text)
        self._in_call = False
        self._ws = ""  # whitespace held at the end of the content

    def feed(self, text: str) -> StreamedPiece:
        piece = StreamedPiece("", [])
        self._buf += text
        while True:
            if self._in_call:
                j = self._buf.find(self.end)
                if j < 0:
                    return piece
                block, self._buf, self._in_call = self._buf[:j], self._buf[j + len(self.end):], False
                self._block(self.start + block + self.end, piece)
                continue
            i = self._buf.find(self.start)
            if i >= 0:
                self._say(self._buf[:i], piece)
                self._buf, self._in_call = self._buf[i + len(self.start):], True
                continue
            keep = _marker_prefix(self._buf, self.start)
            self._say(self._buf[:len(self._buf) - keep], piece)
            self._buf = self._buf[len(self._buf) - keep:]
            return piece

    def close(self) -> StreamedPiece:
        """The end of the reply: what is still held."""
        piece = StreamedPiece("", [])
        rest, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            self._block(self.start + rest, piece)
        else:
            self._say(rest, piece)
        if not self.calls and self._ws:
            piece.content += self._ws
            self.content += self._ws
        self._ws = ""
        return piece

    def _block(self, raw: str, piece: StreamedPiece) -> None:
        parsed = parse_tool_calls(raw, self.fmt)
        if len(parsed.calls) == 1 and not parsed.errors:
            self.calls.append(parsed.calls[0])
            piece.calls.append(parsed.calls[0])
        else:
            self._say(raw, piece)

    def _say(self, text: str, piece: StreamedPiece) -> None:
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body):]
        if not self.content and self.calls:
            body = body.lstrip()
        piece.content += body
        self.content += body


def _marker_prefix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
