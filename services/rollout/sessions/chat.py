"""A session's next chat prompt from the previous call's exact ids (token-in / token-out for chat agents).

An OpenAI-speaking agent sends the whole conversation every call. When it is the previous call's messages,
then the assistant reply this server returned (content and tool calls as sent), then new messages (tool
results, a user turn), the next prompt is

    previous prompt ids + previous output ids + the template's turn ending + the template delta of the new messages

so the model's earlier turns are never re-tokenised (:class:`~services.rollout.chat_tokens.ChatTokens`).
Anything else (an edited history, a reply the agent changed) is rendered through the template as usual: the
session then starts a new trajectory unless the rendering happens to extend the last one.
"""

from __future__ import annotations

import json
from typing import Any

from services.rollout.chat_tokens import ChatTokensCache, template_key

__all__ = ["ChatTokensCache", "continuation", "same_reply", "template_key"]
from services.rollout.sessions.store import ChatTurn, Session


def _calls(tool_calls: Any) -> list[tuple[Any, Any]] | None:
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
