"""Token-in / token-out over a chat template: the ids of a conversation grow by appending, never by
re-tokenising what the model wrote.

Re-rendering a conversation through the template each turn and tokenising it again does not give back the
ids the model sampled (merges across boundaries, whitespace, special tokens): the learner would train on
tokens the policy never produced. Instead a multi-turn rollout keeps one id list: the rendered prompt, then
the model's output ids exactly as sampled, then for each environment turn only the *template's delta* for
the new messages, computed here once per message list against a fixed dummy context:

    delta(msgs) = ids(render(ctx + msgs, add_generation_prompt=True)) - ids(render(ctx))

which is what the template writes for those messages plus the next assistant header. Between the model's
output and that delta come the tokens the template puts after an assistant turn (its end-of-turn token, if
the model stopped some other way, then e.g. a newline): :meth:`ChatTokens.close_turn`.

A template that rewrites earlier turns when a message is added (so the delta is not a suffix) is refused
with an error at start: token fidelity cannot hold for it.

Renders are memoised per message list (:data:`MEMO_SIZE` lists, the least recently used dropped first): the
``n`` trajectories of a group share their first prompt, and environments often send the same message again
(a fixed reply, a recurring tool error), each otherwise a template render and a tokenisation per turn.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

_CTX = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
MEMO_SIZE = 256
"""Message lists whose ids each :class:`ChatTokens` keeps (prompts and deltas)."""


class TemplateNotAppendOnly(ValueError):
    """The chat template does not render a conversation by appending; token-in/token-out cannot work."""


class ChatTokens:
    """Ids of prompts, turn endings and environment messages for one tokenizer and chat template."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None, template_kwargs: dict | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateNotAppendOnly("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.kwargs = dict(template_kwargs or {})
        self._context_ids = self.render_ids(_CTX, add_generation_prompt=False)  # what every delta is taken against
        self.end_of_turn, self.glue = self._turn_ending()
        self._memo: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()

    def _memoised(self, kind: str, messages: list[dict], render) -> list[int]:
        """``render(messages)``, remembered by the messages' JSON (not kept when they have none)."""
        try:
            key = (kind, json.dumps(messages, sort_keys=True))
        except (TypeError, ValueError):  # not JSON (e.g. an object in a message): rendered every time
            return render(messages)
        ids = self._memo.get(key)
        if ids is None:
            ids = self._memo[key] = tuple(render(messages))
            if len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return list(ids)

    def render_ids(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  tools=self.tools, **self.kwargs)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, messages: list[dict]) -> list[int]:
        """The first prompt: the messages and the assistant header."""
        return self._memoised("prompt", messages, lambda m: self.render_ids(m, add_generation_prompt=True))

    def delta(self, messages: list[dict]) -> list[int]:
        """Ids of ``messages`` (tool results, a user turn) appended after an assistant turn, plus the next
        assistant header: exactly what the template writes for them."""
        return self._memoised("delta", messages, self._delta)

    def _delta(self, messages: list[dict]) -> list[int]:
        before = self._context_ids
        after = self.render_ids([*_CTX, *messages], add_generation_prompt=True)
        if after[: len(before)] != before:
            raise TemplateNotAppendOnly("the chat template changes earlier turns when messages are added")
        return after[len(before):]

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant turn (give them to the engine as stop tokens: a model's eos may
        be another token, e.g. ``</s>`` while turns end with ``<|im_end|>``)."""
        return list(self.end_of_turn[-1:])

    def close_turn(self, output_ids: list[int]) -> list[int]:
        """Ids the template puts after the model's turn ``output_ids``: its end-of-turn token when the model
        stopped without it (a stop string, a tool-call end tag), then the glue (e.g. a newline)."""
        tail = [] if output_ids[-len(self.end_of_turn):] == self.end_of_turn else list(self.end_of_turn)
        return tail + list(self.glue)

    def _turn_ending(self) -> tuple[list[int], list[int]]:
        """(end-of-turn ids, glue ids) the template writes after an assistant message's content."""
        head = self.render_ids(_CTX[:1], add_generation_prompt=True)
        full = self._context_ids
        content = list(self.tokenizer.encode(_CTX[1]["content"], add_special_tokens=False))
        if full[: len(head)] != head or full[len(head): len(head) + len(content)] != content:
            raise TemplateNotAppendOnly("the chat template does not render an assistant turn as header + content")
        suffix = full[len(head) + len(content):]
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        special |= {i for i, t in (getattr(self.tokenizer, "added_tokens_decoder", None) or {}).items() if t.special}
        cut = 0
        while cut < len(suffix) and suffix[cut] in special:
            cut += 1
        return suffix[:cut], suffix[cut:]


def template_key(tools: list[dict] | None, kwargs: dict | None) -> str:
    """The key of a (tools, template kwargs) pair in :class:`ChatTokensCache`."""
    return json.dumps([tools or None, kwargs or None], sort_keys=True, default=str)


class ChatTokensCache:
    """ChatTokens per (tools, template kwargs), shared by sessions and by the worker's trajectories (building one
    renders the template a few times); bounded, the least recently used dropped first."""

    def __init__(self, tokenizer: Any, size: int = 64) -> None:
        self.tokenizer = tokenizer
        self.size = size
        self._items: OrderedDict[str, ChatTokens] = OrderedDict()

    def get(self, tools: list[dict] | None, kwargs: dict | None = None, key: str | None = None) -> ChatTokens:
        key = template_key(tools, kwargs) if key is None else key
        ct = self._items.get(key)
        if ct is None:
            ct = self._items[key] = ChatTokens(self.tokenizer, tools=tools, template_kwargs=kwargs)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        self._items.move_to_end(key)
        return ct
