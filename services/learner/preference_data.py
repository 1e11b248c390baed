"""Preference pairs on local disk, in the layouts users have (read by :func:`services.learner.data.read_rows`:
JSONL, Parquet or a saved HF dataset):

- OpenRLHF's / TRL's columns: ``data.chosen_key`` / ``data.rejected_key`` (text), with the prompt in
  ``data.input_key`` (text or chat messages; ``input_template`` and ``apply_chat_template`` apply as for every
  run). A row without the prompt field is a pair of whole texts (the prompt is empty).
- Chat-message lists per side (HH-RLHF / UltraFeedback as TRL and OpenRLHF read them): each side is a
  conversation whose last message is the assistant's answer; the messages before it are the prompt (and must be
  the same on both sides). A side of only the assistant's message takes its prompt from ``data.input_key``.

A pair becomes token ids two ways: :func:`rm_text` (a reward model reads prompt + response as one text, exactly
as the reward service's ``hf_rm`` scorer builds it, so a model trained here scores the same there), and
:func:`policy_ids` (DPO: the prompt as the rollout fleet tokenises it, the response + eos).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.learner.data import DataError, PromptSet, field_value, prompt_ids_of, read_rows, row_prompt
from services.learner.settings import DataSettings
from shared.schemas import ChatMessage

Prompt = str | list[ChatMessage]


@dataclass(frozen=True)
class PreferencePair:
    prompt: Prompt
    chosen: str
    rejected: str
    margin: float | None = None  # Bradley-Terry margin (rm, algorithm.margin_key)
    ref_chosen: float | None = None  # precomputed reference log-probabilities (dpo)
    ref_rejected: float | None = None


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def _side(row: dict, key: str, n: int, where: str) -> Any:
    try:
        return field_value(row, key)
    except KeyError:
        setting = "chosen_key" if key == "chosen" else "rejected_key" if key == "rejected" else None
        hint = f"set data.{setting} to one of them" if setting else "set the data key naming it"
        raise DataError(f"{key!r} names no field of row {n} of {where} (fields: {sorted(row)}): {hint}") from None


def pair_of_row(row: dict, n: int, settings: DataSettings, where: str, margin_key: str | None = None,
                ref_keys: tuple[str, str] | None = None) -> PreferencePair:
    """One row as a :class:`PreferencePair`; DataError naming the row and the setting when it is not one."""
    chosen = _side(row, settings.chosen_key, n, where)
    rejected = _side(row, settings.rejected_key, n, where)
    if _is_messages(chosen) != _is_messages(rejected):
        raise DataError(f"row {n} of {where}: one side is chat messages and the other is not; give both sides the "
                        "same form")
    if _is_messages(chosen):
        msgs_c = [ChatMessage.model_validate(m) for m in chosen]
        msgs_r = [ChatMessage.model_validate(m) for m in rejected]
        if msgs_c[-1].role != "assistant" or msgs_r[-1].role != "assistant":
            raise DataError(f"row {n} of {where}: each side's last message must be the assistant's answer")
        if msgs_c[:-1] != msgs_r[:-1]:
            raise DataError(f"row {n} of {where}: the messages before the answers differ between chosen and rejected "
                            "(they are the prompt, shared by both)")
        prompt: Prompt = msgs_c[:-1] if len(msgs_c) > 1 else _prompt(row, settings)
        chosen_text, rejected_text = str(msgs_c[-1].content), str(msgs_r[-1].content)
    else:
        prompt, chosen_text, rejected_text = _prompt(row, settings), str(chosen), str(rejected)
    margin = float(_side(row, margin_key, n, where)) if margin_key else None
    ref = tuple(float(_side(row, k, n, where)) for k in ref_keys) if ref_keys else (None, None)
    return PreferencePair(prompt, chosen_text, rejected_text, margin, *ref)


def _prompt(row: dict, settings: DataSettings) -> Prompt:
    try:
        return row_prompt(row, settings)
    except KeyError:
        return ""  # whole texts on each side


def read_pairs(path: str, settings: DataSettings, margin_key: str | None = None,
               ref_keys: tuple[str, str] | None = None, max_pairs: int | None = None) -> list[PreferencePair]:
    """Every row of ``path`` as a pair (the first ``max_pairs``); DataError when a row is not a pair."""
    rows = read_rows(path, settings.split)
    if max_pairs is not None:
        rows = rows[:max_pairs]
    if not rows:
        raise DataError(f"{path} holds no rows")
    return [pair_of_row(row, n, settings, str(path), margin_key, ref_keys) for n, row in enumerate(rows)]


class PairSet(PromptSet):
    """The training pairs, visited in the same seeded permutation per epoch as every dataset
    (:meth:`PromptSet.order`), so a position ``(epoch, index)`` names the same pair after a restart."""

    pairs: list[PreferencePair]

    @classmethod
    def load_pairs(cls, settings: DataSettings, seed: int, margin_key: str | None = None,
                   ref_keys: tuple[str, str] | None = None) -> PairSet:
        if settings.path is None:  # as PromptSet.load says it
            raise ValueError("data.path is not set: name the preference pairs (JSONL, Parquet or a saved dataset "
                             "directory)")
        pairs = read_pairs(settings.path, settings, margin_key, ref_keys, settings.max_samples)
        out = cls(settings, [{} for _ in pairs], seed)
        out.pairs = pairs
        return out

    def pair(self, epoch: int, index: int) -> PreferencePair:
        return self.pairs[int(self.order(epoch)[index])]


# ---- tokens -------------------------------------------------------------------------------------------------
def render_text_prompt(prompt: Prompt) -> str:
    """A prompt as the reward service's hf_rm scorer renders it without a chat template (ChatML, assistant turn
    opened); text prompts as they are."""
    if isinstance(prompt, str):
        return prompt
    turns = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in prompt)
    return turns + "<|im_start|>assistant\n"


def rm_text(tokenizer: Any, prompt: Prompt, response: str, append_eos: bool = True) -> str:
    """The text a reward model reads for (prompt, response): the hf_rm scorer's rule (chat template for messages
    when the tokenizer has one, else the rendered prompt + response; trailing pad / eos text stripped and one eos
    appended). Tested against a real reward service's ``/score``."""
    if isinstance(prompt, list) and tokenizer.chat_template:
        messages = [m.model_dump() for m in prompt] + [{"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    else:
        text = render_text_prompt(prompt) + response
    if append_eos and tokenizer.eos_token:
        specials = [t for t in (tokenizer.pad_token, tokenizer.eos_token) if t]
        changed = True
        while changed:
            changed = False
            for t in specials:
                if text.endswith(t):
                    text, changed = text[: -len(t)], True
        text += tokenizer.eos_token
    return text


def rm_ids(tokenizer: Any, prompt: Prompt, response: str, append_eos: bool, max_length: int) -> list[int]:
    """Token ids of :func:`rm_text`, the last ``max_length`` kept (as the scorer truncates on the left)."""
    ids = list(tokenizer(rm_text(tokenizer, prompt, response, append_eos), add_special_tokens=False)["input_ids"])
    return ids[-max_length:]


def policy_ids(tokenizer: Any, prompt: Prompt, response: str) -> tuple[list[int], list[int]]:
    """(prompt ids as the rollout fleet makes them, response ids + eos), as an SFT pair is tokenised."""
    prompt_ids = prompt_ids_of(tokenizer, prompt) or [tokenizer.bos_token_id or tokenizer.eos_token_id]
    answer = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    return prompt_ids, answer + [tokenizer.eos_token_id]
