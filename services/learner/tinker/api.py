"""The JSON request bodies of the Tinker API routes this server reads (the fields it uses; the client's
``tinker.types`` are the reference). Bounds here are the server's; a body outside them gets 400."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSession(_Body):
    tags: list[str] = Field(default_factory=list, max_length=256)
    sdk_version: str = ""


class SessionRef(_Body):
    session_id: str = Field(max_length=200)


class FinishReason(_Body):
    type: Literal["success", "errored", "interrupted"]


class FinishSession(_Body):
    """``ServiceClient.close(status, detail)``: the session ends now, not after its heartbeat times out."""

    reason: FinishReason
    detail: str | None = Field(default=None, max_length=4000)


class LoraConfig(_Body):
    rank: int = Field(ge=1)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModel(_Body):
    session_id: str = Field(max_length=200)
    model_seq_id: int = Field(ge=0)
    base_model: str = Field(max_length=4096)
    lora_config: LoraConfig | None = None
    optimizer_config: dict[str, Any] | None = None


class ModelRef(_Body):
    model_id: str = Field(max_length=300)


class AdamParams(_Body):
    learning_rate: float = Field(default=1e-4, ge=0.0, le=10.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-12, gt=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    grad_clip_norm: float = Field(default=0.0, ge=0.0)
    type: Literal["adam", "adamw"] | None = None


class OptimStep(_Body):
    model_id: str = Field(max_length=300)
    seq_id: int | None = None
    adam_params: AdamParams


class SaveWeights(_Body):
    model_id: str = Field(max_length=300)
    path: str | None = Field(default=None, max_length=128)
    seq_id: int | None = None
    sampling_session_seq_id: int | None = Field(default=None, ge=0)


class LoadWeights(_Body):
    model_id: str | None = Field(default=None, max_length=300)
    seq_id: int | None = None
    session_id: str | None = Field(default=None, max_length=200)
    model_seq_id: int | None = Field(default=None, ge=0)
    path: str = Field(max_length=1024)
    optimizer: bool = False


class CreateSamplingSession(_Body):
    session_id: str = Field(max_length=200)
    sampling_session_seq_id: int = Field(ge=0)
    base_model: str | None = Field(default=None, max_length=4096)
    model_path: str | None = Field(default=None, max_length=1024)


class TextChunk(_Body):
    tokens: list[int] = Field(max_length=1 << 20)
    type: Literal["encoded_text"] = "encoded_text"


class ModelInput(_Body):
    chunks: list[TextChunk] = Field(max_length=4096)


class SamplingParams(_Body):
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_k: int = -1
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class Sample(_Body):
    num_samples: int = Field(default=1, ge=1)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: str | None = Field(default=None, max_length=4096)
    model_path: str | None = Field(default=None, max_length=1024)
    sampling_session_id: str | None = Field(default=None, max_length=300)
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    target_prompt_logprobs: Any = None


class WeightsInfo(_Body):
    tinker_path: str = Field(max_length=1024)


class RetrieveFuture(_Body):
    request_id: str = Field(max_length=200)
    allow_metadata_only: bool = False


class RequestRef(_Body):
    request_id: str = Field(max_length=200)


class SamplingSessionRef(_Body):
    sampling_session_id: str = Field(max_length=300)


class FuturesTarget(_Body):
    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str = Field(max_length=300)
    cloned_sampler_id: int = Field(default=0, ge=0)


class RetrieveFutures(_Body):
    target: FuturesTarget
    prev_cursor: int = Field(default=0, ge=0)
    timeout: float | None = Field(default=None, ge=0.0)
    retrieved_request_ids: list[str] = Field(default_factory=list, max_length=100_000)
