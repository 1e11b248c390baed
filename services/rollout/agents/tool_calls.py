"""Tool calls in the model's own text format, parsed into OpenAI ``tool_calls``.

Chat templates that support tools render a model's call as text, and the model writes it back the same
way. The formats are registered by name (:data:`TOOL_CALL_FORMATS`); a model that does not follow one
exactly — broken JSON, no ``name``, arguments that are not an object — gets a :class:`ToolCallError`,
which a multi-turn rollout turns into an error observation the model sees (never an exception that ends
the rollout).

- ``hermes`` (Qwen2.5 / Qwen3, Hermes, many fine-tunes): ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>``, one block per call, anywhere in the turn.
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


def parse_tool_calls(text: str, fmt: str = "hermes") -> ParsedTurn:
    if fmt not in TOOL_CALL_FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; known: {sorted(TOOL_CALL_FORMATS)}")
    return TOOL_CALL_FORMATS[fmt](text)
