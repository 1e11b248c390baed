"""Engine-level request and result records (internal to the rollout service; no torch here).

One :class:`SequenceRequest` is one sequence to sample. A wire request with a batch of prompts and
``n`` samples per prompt becomes ``len(prompts) * n`` sequence requests, which the engine batches
(the hf engine gathers them into one decode batch; the SGLang / vLLM servers batch them themselves).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shared.generate_api import GrammarKind

FinishType = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Finish:
    """Why a sequence ended, in SGLang's shape: ``{"type": ..., "matched"|"length"|"message": ...}``."""

    type: FinishType
    matched: str | int | None = None  # stop: the stop string or token id that ended it
    length: int | None = None  # length: tokens generated
    message: str | None = None  # abort: why

    def to_wire(self) -> dict:
        out: dict = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        elif self.type == "length":
            out["length"] = self.length
        else:
            out["message"] = self.message
        return out


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling settings, already validated by the wire layer."""

    max_new_tokens: int = 128
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # <= 0 disables
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False  # keep the matched stop string in `text`
    seed: int | None = None
    top_logprobs: int = 0  # alternatives per position to return (0 = only the sampled token's logprob)
    # Optional features: an engine applies those in its ``honours`` (see :meth:`features_used`).
    min_new_tokens: int = 0  # no stop token / string / regex ends the sequence before this many tokens
    stop_regex: tuple[str, ...] = ()  # a match in the text ends the sequence (trimmed like a stop string)
    spaces_between_special_tokens: bool = True  # passed to the tokenizer's decode
    frequency_penalty: float = 0.0  # minus this times the token's count in the output so far
    presence_penalty: float = 0.0  # minus this once a token is in the output
    repetition_penalty: float = 1.0  # CTRL's: logits of prompt / output tokens divided (> 0) or multiplied by it
    grammar: Grammar | None = None  # structured output: the text matches this

    def features_used(self) -> list[str]:
        """The optional features (:data:`FEATURES`) this sequence asks for: those not at their default."""
        return [name for name, default in FEATURES.items() if getattr(self, name) != default]


@dataclass(frozen=True)
class Grammar:
    """A structured-output constraint: ``kind`` says how ``spec`` reads (SGLang's and vLLM's names)."""

    kind: GrammarKind
    spec: str  # the regex, the JSON schema as JSON text, the EBNF grammar ("" for json_object)


FEATURES: dict[str, object] = {
    "min_new_tokens": 0, "stop_regex": (), "spaces_between_special_tokens": True, "frequency_penalty": 0.0,
    "presence_penalty": 0.0, "repetition_penalty": 1.0, "grammar": None,
}
"""Sampling features beyond the core (length, temperature, top-k/p, min-p, stops, seeds, logprobs) and their
"not used" values. Each engine class lists those it applies in ``Engine.honours``; a request that uses another
is refused with a 400 naming the field and the engine, never run without it."""


@dataclass(frozen=True)
class SequenceRequest:
    """One sequence to generate. ``rid`` is unique while in flight; ``Engine.abort(rid)`` targets it."""

    rid: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stream: bool = False  # emit a delta per token (else one delta at the end)
    #: the last ``resumed`` prompt ids are this sequence's own earlier output (a partial-rollout continuation): its
    #: grammar and penalties carry on from them
    resumed: int = 0


@dataclass
class SequenceDelta:
    """New tokens of a sequence since the previous delta; ``finish`` is set on the last one.

    ``text`` is the new *visible* text: text that might still turn out to be the start of a stop string
    is held back until it is known not to be.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish: Finish | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    weight_version: int | None = None  # the weights that produced these tokens (stamped by Engine.stream)


@dataclass
class SequenceOutput:
    """A finished sequence, gathered from its deltas."""

    rid: str
    prompt_ids: tuple[int, ...]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    text: str = ""
    finish: Finish | None = None
    weight_version: int = 0  # the oldest version any of its tokens came from
    #: [(first output token, version), ...] when the weights changed during generation (partial rollouts:
    #: ``weights.pause_mode: partial``); None when one version produced every token
    version_spans: list[tuple[int, int]] | None = None

    def add(self, delta: SequenceDelta) -> None:
        v = delta.weight_version
        if v is not None and delta.token_ids:
            spans = self.version_spans if self.version_spans is not None else []
            if not spans or spans[-1][1] != v:
                spans.append((len(self.output_ids), v))
            self.version_spans = spans
        self.output_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        self.text += delta.text
        if delta.top_logprobs is not None:
            self.top_logprobs = (self.top_logprobs or []) + delta.top_logprobs
        if delta.finish is not None:
            self.finish = delta.finish

    def settle(self, current_version: int) -> SequenceOutput:
        """Once the last delta is in: ``weight_version`` is the oldest version of its tokens (``current_version``
        when no delta carried one), and ``version_spans`` is kept only when the weights changed mid-sequence."""
        spans = self.version_spans
        self.weight_version = min(v for _, v in spans) if spans else current_version
        if spans is not None and len(spans) == 1:
            self.version_spans = None  # one version made every token
        return self
