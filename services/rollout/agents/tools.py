"""Tools a model can call in a multi-turn rollout: OpenAI function schemas, executed with a timeout.

What goes wrong is sorted by whose fault it is:

- the **model's** (an unknown tool, a missing required argument, arguments the tool refuses by raising
  :class:`ToolInputError`, an unreadable call): an error *observation* — the model reads it as the tool's
  reply and can do better next turn;
- the **environment's** (the tool raised anything else, hung past its timeout, or returned something that is
  not text or JSON): :class:`ToolFailure`, which fails the trajectory with that reason (retried, then
  dead-lettered by the worker) — never a crash, never a reward made up for it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.rollout.agents.tool_calls import ToolCall


class ToolInputError(ValueError):
    """Raised by a tool whose arguments it cannot use: the message goes back to the model."""


class ToolFailure(RuntimeError):
    """A tool failed on its own (raised, hung, returned garbage): the trajectory fails with this reason."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]  # sync or async, called with the arguments as keyword arguments
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (``tools=[...]`` of a chat request and of chat templates)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolResult:
    call: ToolCall
    content: str
    error: bool = False

    def message(self) -> dict[str, Any]:
        """The ``tool`` message that carries this result back to the model."""
        return {"role": "tool", "tool_call_id": self.call.id, "name": self.call.name, "content": self.content}


class ToolBox:
    """The tools of one environment, run with a timeout each."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float = 10.0, max_result_chars: int = 4000) -> None:
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s
        self.max_result_chars = max_result_chars

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    async def call(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(call, f"error: there is no tool named {call.name!r}; tools: {sorted(self.tools)}", True)
        missing = [k for k in tool.parameters.get("required", []) if k not in call.arguments]
        if missing:
            return ToolResult(call, f"error: {call.name} needs the argument(s) {missing}", True)
        try:
            if inspect.iscoroutinefunction(tool.fn):
                value = await asyncio.wait_for(tool.fn(**call.arguments), self.timeout_s)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(tool.fn, **call.arguments), self.timeout_s)
        except ToolInputError as exc:
            return ToolResult(call, f"error: {exc}", True)
        except TypeError as exc:  # arguments the function does not take
            if "argument" in str(exc):
                return ToolResult(call, f"error: {call.name}: {exc}", True)
            raise ToolFailure(f"tool {call.name} raised TypeError: {exc}") from exc
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise ToolFailure(f"tool {call.name} did not answer within {self.timeout_s:g}s") from exc
        except Exception as exc:  # the environment's failure, reported with its reason
            raise ToolFailure(f"tool {call.name} raised {type(exc).__name__}: {exc}") from exc
        return ToolResult(call, self._text(call.name, value))

    def _text(self, name: str, value: Any) -> str:
        if isinstance(value, str):
            text = value
        else:
            try:
                text = json.dumps(value, ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise ToolFailure(f"tool {name} returned {type(value).__name__}, which is neither text nor JSON") from exc
        return text if len(text) <= self.max_result_chars else text[: self.max_result_chars] + " …[truncated]"
