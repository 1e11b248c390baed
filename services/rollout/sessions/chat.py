"""A session's next chat prompt from the previous call's exact ids (token-in / token-out for chat agents).

An OpenAI-speaking agent sends the whole conversation every call. When it is the previous call's messages,
then the assistant reply this server returned (content and tool calls as sent), then new messages (tool
results, a user turn), the next prompt is

    previous prompt ids + previous output ids + the template's turn ending + the template delta of the new messages

so the model's earlier turns are never re-tokenised (:class:`~services.rollout.agents.chat_tokens.ChatTokens`).
Anything else (an edited history, a reply the agent changed) is rendered through the template as usual: the
session then starts a new trajectory unless the rendering happens to extend the last one.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from services.rollout.agents.chat_tokens import ChatTokens
from services.rollout.sessions.store import ChatTurn, Session


def template_key(tools: list[dict] | None, kwargs: dict | None) -> str:
    return json.dumps([tools or None, kwargs or None], sort_keys=True, default=str)


def _calls(tool_calls: Any) -> list[tuple[str, Any]] | None:
    """(name, arguments as a value) of OpenAI ``tool_calls``; None if unreadable."""
    out = []
    for c in tool_calls or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            return None
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            return None
        out.append((fn.get("name"), args))
    return out


def same_reply(echoed: dict[str, Any], reply: dict[str, Any]) -> bool:
    """Whether the agent sent back the assistant message this server returned."""
    if echoed.get("role") != "assistant":
        return False
    if (echoed.get("content") or "") != (reply.get("content") or ""):
        return False
    return _calls(echoed.get("tool_calls")) == _calls(reply.get("tool_calls"))


class ChatTokensCache:
    """ChatTokens per (tools, template kwargs), shared by the sessions (building one renders the template a few
    times); bounded, the least recently used dropped first."""

    def __init__(self, tokenizer: Any, size: int = 64) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self._items: OrderedDict[str, ChatTokens] = OrderedDict()

    def get(self, tools: list[dict] | None, kwargs: dict | None, key: str) -> ChatTokens:
        ct = self._items.get(key)
        if ct is None:
            ct = self._items[key] = ChatTokens(self.tokenizer, tools=tools, template_kwargs=kwargs)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        self._items.move_to_end(key)
        return ct


def continuation(session: Session, messages: list[dict[str, Any]], cache: ChatTokensCache, tools: list[dict] | None,
                 kwargs: dict | None) -> list[int] | None:
    """The prompt ids continuing the session's last chat call, or None when ``messages`` do not continue it."""
    last: ChatTurn | None = session.chat
    key = template_key(tools, kwargs)
    if last is None or last.template_key != key:
        return None
    n = len(last.messages)
    if len(messages) < n + 2 or messages[:n] != last.messages or not same_reply(messages[n], last.reply):
        return None
    tail = messages[n + 1:]
    if any(m.get("role") == "assistant" for m in tail):
        return None
    try:
        ct = cache.get(tools, kwargs, key)
        return last.prompt_ids + last.output_ids + ct.close_turn(last.output_ids) + ct.delta(tail)
    except Exception:  # noqa: BLE001 - TemplateNotAppendOnly or a template error: render the conversation instead
        return None
