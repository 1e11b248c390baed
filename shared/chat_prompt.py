"""How a chat prompt (a list of ``{"role", "content"}`` messages: verl's and OpenRLHF's chat data) becomes token
ids — one rendering for every place a prompt goes: the rollout fleet in training, SFT, held-out evaluation and
``fleetrl eval``. The model's chat template renders the text with the generation prompt appended; the text is
then tokenised WITHOUT the tokenizer's own special tokens (a template writes its BOS itself; adding another would
give the model a prompt it never saw in training).

Text prompts are tokenised as the rollout service tokenises ``/generate`` text (``tokenizer.encode(text)``).
Torch-free; ``tokenizer`` is any Hugging Face tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ChatPromptError(ValueError):
    """The messages cannot be rendered (no chat template, a template error); the message says why."""


def as_messages(value: Any) -> list[dict[str, Any]] | None:
    """``value`` as plain message dicts when it is a chat prompt (a list of mappings or pydantic messages),
    else None."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for m in value:
        if hasattr(m, "model_dump"):
            m = m.model_dump(exclude_none=True)
        if not isinstance(m, dict) or "role" not in m:
            return None
        out.append(dict(m))
    return out


def chat_prompt_text(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> str:
    """The model's chat template applied to ``messages``, with the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatPromptError("the model's tokenizer has no chat template, so chat-message prompts cannot be "
                              "rendered; use a model with one, or text prompts")
    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # template errors come from the data's messages
        raise ChatPromptError(f"the chat template could not render these messages: {exc}") from exc


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Token ids of ``messages`` rendered by :func:`chat_prompt_text` (no special tokens added on top)."""
    ids = list(tokenizer.encode(chat_prompt_text(tokenizer, messages), add_special_tokens=False))
    if not ids:
        raise ChatPromptError("the chat prompt tokenises to nothing")
    return ids


def text_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a text prompt, as the rollout service tokenises ``/generate`` text."""
    return list(tokenizer.encode(text))
