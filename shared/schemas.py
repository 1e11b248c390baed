"""Records that cross a process boundary through the queue: prompt tasks and experiences.

They are frozen pydantic models (immutable records between stages). Their wire form is produced by
:mod:`shared.codec`; token ids and logprobs travel as packed arrays, never as pickle.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.packed import Logprobs, PackedArray, TokenIds, TokenMask

FinishReason = Literal["stop", "length", "abort"]

__all__ = ["ChatMessage", "Experience", "FinishReason", "PackedArray", "PromptTask", "SamplingOverrides", "SamplingRecord",
           "experience_alignment_problem", "sample_id"]


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
    grant: str | None = Field(default=None, max_length=128, description=(
        "The learner's proof that it issued this group (an HMAC under a key only the learner holds); workers copy "
        "it into every experience of the group and pass it nowhere else (not to programs, not to scorers)."))
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


class SamplingRecord(BaseModel):
    """The sampling parameters a sample was generated with (what the learner needs to score it the same way)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float = Field(ge=0.0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, description="-1 or 0: off.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    max_tokens: int = Field(ge=1, description="The generation budget of the sample.")

    @property
    def truncated(self) -> bool:
        """True when the distribution was cut (top-p, top-k or min-p): its logprobs are not the model's."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


class Experience(BaseModel):
    """One generated trajectory with its reward: what the learner trains on.

    A single-turn sample is the one-turn case: ``response_token_ids`` are the tokens after the prompt,
    all generated by the model. A multi-turn trajectory puts every turn after the prompt there —
    model turns and environment / tool turns, in order — and ``action_mask`` marks which tokens the
    model generated (1: trained on) and which the environment wrote (0: context only).

    ``response_logprobs`` are the engine's logprobs of the sampled tokens, under the distribution
    they were sampled from (0 on environment tokens); the learner uses them for importance-sampling
    correction. ``version_spans`` say which weight version produced which tokens when weights changed
    during generation (partial rollouts); ``weight_version`` is always the oldest of them.
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
    action_mask: TokenMask | None = Field(
        default=None, description="Per response token: 1 generated by the model (trained on), 0 written by the "
        "environment (a tool result, a user turn). None: every token is the model's.")
    version_spans: list[tuple[int, int]] | None = Field(
        default=None, description="[(first response token, weight version), ...] when the weights changed during "
        "generation: token i comes from the version of the last span starting at or before i. None: every "
        "token from weight_version.")
    sampling: SamplingRecord | None = Field(default=None, description="How the sample was sampled (None: unknown, "
                                                                     "written before schema v2).")
    grant: str | None = Field(default=None, max_length=128, description=(
        "The grant of the prompt task this sample answers (PromptTask.grant): the learner trains only groups it "
        "issued. None: not from a learner-issued task (a session opened by hand, schema before v3)."))

    @model_validator(mode="after")
    def _aligned(self) -> Experience:
        problem = experience_alignment_problem(
            len(self.prompt_token_ids), len(self.response_token_ids), len(self.response_logprobs), self.index,
            self.group_size, self.action_mask, self.version_spans, self.weight_version,
        )
        if problem:
            raise ValueError(problem)
        return self

    def token_versions(self) -> list[int]:
        """The weight version of each response token."""
        n = len(self.response_token_ids)
        if not self.version_spans:
            return [self.weight_version] * n
        out: list[int] = []
        spans = [*self.version_spans, (n, -1)]
        for (start, version), (end, _) in itertools.pairwise(spans):
            out += [version] * (end - start)
        return out


def experience_alignment_problem(prompt_len: int, response_len: int, logprobs_len: int, index: int, group_size: int,
                                 action_mask=None, version_spans=None, weight_version: int = 0) -> str:
    """What is inconsistent across an experience's fields ('' if nothing). Shared by the model and the codec's fast path."""
    if prompt_len == 0:
        return "prompt_token_ids must hold at least one token"
    if logprobs_len != response_len:
        return (f"response_logprobs has {logprobs_len} entries for {response_len} response tokens; "
                "they must align one to one")
    if index >= group_size:
        return f"index {index} is outside a group of size {group_size}"
    if action_mask is not None:
        if len(action_mask) != response_len:
            return f"action_mask has {len(action_mask)} entries for {response_len} response tokens"
        values = action_mask.numpy() if isinstance(action_mask, PackedArray) else action_mask
        if len(values) and int(max(values)) > 1:
            return "action_mask holds values other than 0 and 1"
    if version_spans is not None:
        if not version_spans or version_spans[0][0] != 0:
            return "version_spans must start at response token 0"
        starts = [s for s, _ in version_spans]
        if any(b <= a for a, b in itertools.pairwise(starts)) or (response_len and starts[-1] >= response_len):
            return f"version_spans must start at increasing positions inside the {response_len} response tokens"
        if any(v < 0 for _, v in version_spans):
            return "version_spans hold a negative weight version"
        if min(v for _, v in version_spans) != weight_version:
            return (f"weight_version ({weight_version}) must be the oldest version in version_spans "
                    f"({min(v for _, v in version_spans)})")
    return ""
