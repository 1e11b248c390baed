"""Records that cross a process boundary through the queue: prompt tasks and experiences.

They are frozen pydantic models (immutable records between stages). Their wire form is produced by
:mod:`shared.codec`; token ids and logprobs travel as packed arrays, never as pickle.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.packed import Logprobs, PackedArray, TokenIds

FinishReason = Literal["stop", "length", "abort"]

__all__ = ["ChatMessage", "Experience", "FinishReason", "PackedArray", "PromptTask", "SamplingOverrides", "experience_alignment_problem", "sample_id"]


class ChatMessage(BaseModel):
    """One chat turn, OpenAI style."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class SamplingOverrides(BaseModel):
    """Per-task sampling settings; anything unset falls back to the rollout worker's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_new_tokens: int | None = Field(default=None, ge=1, description="Tokens to generate at most.")
    temperature: float | None = Field(default=None, ge=0.0, description="0 means greedy.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Nucleus mass.")
    top_k: int | None = Field(default=None, ge=-1, description="-1 or 0 disables top-k.")
    stop: list[str] | None = Field(default=None, description="Stop strings (not included in the text).")
    stop_token_ids: list[int] | None = Field(default=None, description="Token ids that end a sequence.")
    ignore_eos: bool | None = Field(default=None, description="Keep generating past EOS.")


class PromptTask(BaseModel):
    """A prompt to roll out ``n`` times as one group. Produced by the learner, consumed by rollout workers.

    Exactly one of ``prompt`` (text or chat messages) and ``prompt_token_ids`` is set. Token ids in,
    token ids out: a task given as ids is never re-tokenised.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, description="Unique per prompt occurrence (epoch included); group id of its samples.")
    prompt: str | list[ChatMessage] | None = Field(default=None, description="Text, or chat messages.")
    prompt_token_ids: TokenIds | None = Field(default=None, description="Already tokenised prompt (int32).")
    label: Any = Field(default=None, description="Ground truth passed to the reward service (JSON value).")
    n: int = Field(default=1, ge=1, le=1024, description="Samples per prompt (group size).")
    sampling: SamplingOverrides = Field(default_factory=SamplingOverrides)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form, passed through to experiences.")
    created_at: float = Field(default_factory=time.time, description="Unix time the task was created.")

    @model_validator(mode="after")
    def _one_prompt_form(self) -> PromptTask:
        has_text = self.prompt is not None and (not isinstance(self.prompt, str) or self.prompt != "")
        has_ids = bool(self.prompt_token_ids)
        if has_text == has_ids:
            raise ValueError("a PromptTask needs exactly one of a non-empty `prompt` or `prompt_token_ids`")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("`prompt` as chat messages must hold at least one message")
        return self


def sample_id(prompt_id: str, index: int) -> str:
    """The deterministic id of sample ``index`` of prompt ``prompt_id``.

    Deterministic so that a prompt regenerated after a crash yields the same sample ids and the
    learner recognises the duplicates.
    """
    return f"{prompt_id}#{index}"


class Experience(BaseModel):
    """One generated sample with its reward: what the learner trains on.

    ``response_logprobs`` are the engine's logprobs of the sampled tokens, under the distribution
    they were sampled from; the learner uses them for importance-sampling correction.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, description="Sample id, see sample_id(); the idempotency key.")
    prompt_id: str = Field(min_length=1)
    group_id: str = Field(min_length=1, description="Samples of one group share it (GRPO/RLOO baselines).")
    group_size: int = Field(ge=1)
    index: int = Field(ge=0, description="Position of this sample in its group.")
    prompt_token_ids: TokenIds = Field(description="Prompt token ids (int32, list-like PackedArray).")
    response_token_ids: TokenIds = Field(description="Generated token ids (int32, list-like PackedArray).")
    response_logprobs: Logprobs = Field(description="Engine logprobs of the generated tokens (float32).")
    finish_reason: FinishReason
    reward: float
    reward_components: dict[str, float] = Field(default_factory=dict)
    weight_version: int = Field(ge=0, description="Policy version that generated the sample.")
    prompt_text: str | None = None
    response_text: str | None = None
    label: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time, description="When the prompt task was created.")
    generated_at: float = Field(default_factory=time.time, description="When the sample was finished.")

    @model_validator(mode="after")
    def _aligned(self) -> Experience:
        problem = experience_alignment_problem(
            len(self.prompt_token_ids), len(self.response_token_ids), len(self.response_logprobs), self.index, self.group_size
        )
        if problem:
            raise ValueError(problem)
        return self


def experience_alignment_problem(prompt_len: int, response_len: int, logprobs_len: int, index: int, group_size: int) -> str:
    """What is inconsistent across an experience's fields ('' if nothing). Shared by the model and the codec's fast path."""
    if prompt_len == 0:
        return "prompt_token_ids must hold at least one token"
    if logprobs_len != response_len:
        return (f"response_logprobs has {logprobs_len} entries for {response_len} response tokens; "
                "they must align one to one")
    if index >= group_size:
        return f"index {index} is outside a group of size {group_size}"
    return ""
