"""Wire types of vLLM's token-in / token-out endpoint, ``POST /inference/v1/generate``, as the rollout serves it.

Importable without torch. vLLM serves this route at the server root (not under ``/v1``); the ``verifiers``
training client and orchestrators built on it (prime-rl) render chat messages to token ids themselves and
call it with an ``X-Session-ID`` header (the rollout's trace id), reading the context length once from
``GET /v1/models`` (``max_model_len`` on the model card).

Request ``{"model", "token_ids": [...], "sampling_params": {...}, "cache_salt"?, "priority"?, "stream"?}``;
response ``{"request_id", "choices": [{"index", "token_ids", "logprobs": {"content": [{"token":
"token_id:<id>", "logprob", "top_logprobs": [...]}, ...]}, "finish_reason"}], "usage", "prompt_token_ids"?}``.

Unknown fields are handled as vLLM handles them: ignored (vLLM's request model and its msgspec
``SamplingParams`` both drop what they do not know); the route logs their names. ``null`` means the default.
``min_tokens``, the penalties and ``structured_outputs`` are applied when the serving engine honours them (else a
400 naming the field and the engine). Known vLLM fields FleetRL cannot honour (``logit_bias``, prompt logprobs,
multimodal ``features``,
``priority`` other than 0) are accepted at their neutral value only: anything else is a 400 naming the
field, never silently ignored. Fields that only shape vLLM's own output (``detokenize``, ``flat_logprobs``,
``skip_special_tokens``, ...) are accepted and have no effect here: this endpoint returns no text.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.generate_api import ChoiceLogprobs, GrammarKind, WeightVersion
from shared.wire_checks import (
    INT32_MAX,
    SEED_MAX,
    FiniteFloat,
    StrictBool,
    StrictInt,
    Utf8Fields,
    check_token_ids,
)

MAX_TOP_LOGPROBS = 20
MAX_N = 1024
GENERATE_PATH = "/inference/v1/generate"
SESSION_ID_HEADER = "X-Session-ID"


def _neutral(model: BaseModel, fields: dict[str, Any]) -> None:
    for name, neutral in fields.items():
        value = getattr(model, name)
        if value != neutral:
            raise ValueError(f"{name}={value!r} is not supported by this server (leave it out or at {neutral!r})")


class _VLLMShaped(Utf8Fields):
    model_config = ConfigDict(extra="allow")  # vLLM ignores unknown fields; so does this endpoint (and logs them)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """``null`` means the default, as in vLLM's own request models."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class TokenSamplingParams(_VLLMShaped):
    """``sampling_params``: vLLM's ``SamplingParams`` names and defaults."""

    n: StrictInt = Field(default=1, ge=1, le=MAX_N, description="Samples of the prompt.")
    temperature: FiniteFloat = Field(default=1.0, ge=0.0, description="0 means greedy.")
    top_p: FiniteFloat = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(default=0, ge=-1, le=INT32_MAX, description="0 or -1 disables top-k.")
    min_p: FiniteFloat = Field(default=0.0, ge=0.0, le=1.0)
    seed: StrictInt | None = Field(default=None, ge=0, le=SEED_MAX)
    stop: str | list[str] | None = Field(default=None, description="Stop strings.")
    stop_token_ids: list[StrictInt] | None = Field(default=None, description="Token ids that end a sample (kept).")
    ignore_eos: StrictBool = False
    max_tokens: StrictInt | None = Field(
        default=None, ge=1, le=INT32_MAX, description="Tokens to generate at most; left out: the rest of the context "
        "(vLLM's server default).")
    logprobs: StrictInt | None = Field(
        default=None, ge=0, le=MAX_TOP_LOGPROBS, description="Top alternatives per token; the sampled token's logprob "
        "is always included when set (vLLM: N alternatives, the sampled one first).")
    # Accepted, no effect here (they shape vLLM's text or its internal representation; no text is returned).
    detokenize: StrictBool = True
    flat_logprobs: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    extra_args: dict[str, Any] | None = Field(default=None, description="For vLLM plug-ins; ignored here.")
    skip_reading_prefix_cache: StrictBool | None = None
    routed_experts_prompt_start: StrictInt = Field(default=0, ge=0, description="MoE routing data: none is returned here.")
    # Applied when the serving engine honours them (else a 400 naming the field and the engine).
    min_tokens: StrictInt = Field(default=0, ge=0, le=INT32_MAX, description="No stop ends it before this many.")
    presence_penalty: FiniteFloat = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: FiniteFloat = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: FiniteFloat = Field(default=1.0, gt=0.0, le=2.0)
    structured_outputs: dict[str, Any] | None = Field(
        default=None, description="vLLM's StructuredOutputsParams: one of `regex`, `json` (a schema, or true for any "
        "object), `grammar` (EBNF), `json_object`; the others (choice, structural_tag, ...) are refused.")
    # vLLM fields honoured only at their neutral value.
    prompt_logprobs: StrictInt | None = None
    logit_bias: dict[str, FiniteFloat] | None = None
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None
    logprob_token_ids: list[StrictInt] | None = None
    trace_decode_token_ids: list[StrictInt] | None = None
    thinking_token_budget: StrictInt | None = None

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_ids(cls, v):
        return check_token_ids(v, "sampling_params.stop_token_ids", nested=False)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        items = [v] if isinstance(v, str) else list(v or [])
        if any(not s for s in items):
            raise ValueError("stop strings must be non-empty")
        return v

    @model_validator(mode="after")
    def _neutral_only(self) -> TokenSamplingParams:
        _neutral(self, {"prompt_logprobs": None, "logit_bias": None, "allowed_token_ids": None, "bad_words": None,
                        "logprob_token_ids": None, "trace_decode_token_ids": None})
        self.grammar()
        if self.thinking_token_budget not in (None, -1):
            raise ValueError("thinking_token_budget is not supported by this server (leave it out)")
        return self

    def grammar(self) -> tuple[GrammarKind, str] | None:
        """(kind, spec) of ``structured_outputs`` in SGLang's names (ValueError naming what is not supported)."""
        so = {k: v for k, v in (self.structured_outputs or {}).items() if v not in (None, False)}
        for key in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern",
                    "_backend", "_backend_was_auto"):
            so.pop(key, None)  # backend options: the grammar's meaning is the same
        if not so:
            return None
        if len(so) > 1:
            raise ValueError(f"structured_outputs: give one constraint (got {', '.join(so)})")
        (key, value), = so.items()
        if key == "regex" and isinstance(value, str):
            return "regex", value
        if key == "grammar" and isinstance(value, str):
            return "ebnf", value
        if key == "json_object" and value is True:
            return "json_object", ""
        if key == "json" and isinstance(value, (dict, str)):
            return "json_schema", value if isinstance(value, str) else json.dumps(value)
        raise ValueError(f"structured_outputs.{key} is not supported by this server (regex, json, grammar and "
                         "json_object are)")

    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class StreamOptionsIn(_VLLMShaped):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class TokenGenerateRequest(_VLLMShaped):
    """Body of ``POST /inference/v1/generate``."""

    token_ids: list[StrictInt] = Field(min_length=1, description="The prompt, as token ids (used as is).")
    sampling_params: TokenSamplingParams
    model: str | None = Field(default=None, description="Must name the served model when given.")
    request_id: str | None = Field(default=None, max_length=256, description="Echoed (prefixed) in the response.")
    stream: StrictBool | None = False
    stream_options: StreamOptionsIn | None = None
    cache_salt: str | None = Field(default=None, description="Prefix-cache salt; accepted (the hf engine has no "
                                                             "shared prefix cache).")
    priority: StrictInt = Field(default=0, description="Only 0: this server does not schedule by priority.")
    return_token_ids: StrictBool = Field(default=False, description="Add prompt_token_ids to the response.")
    kv_transfer_params: dict[str, Any] | None = None
    features: Any = Field(default=None, description="Multimodal features: not supported (leave it out).")

    @field_validator("token_ids", mode="before")
    @classmethod
    def _ids(cls, v):
        return check_token_ids(v, "token_ids", nested=False)

    @model_validator(mode="after")
    def _checks(self) -> TokenGenerateRequest:
        if self.priority != 0:
            raise ValueError(f"priority={self.priority}: this server does not use priority scheduling (send 0 or leave "
                             "it out)")
        _neutral(self, {"kv_transfer_params": None, "features": None})
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self


# ---- response --------------------------------------------------------------------------------------------
class TokenGenerateChoice(BaseModel):
    index: int
    logprobs: ChoiceLogprobs | None = Field(default=None, description="OpenAI's shape; each token spelled 'token_id:<id>'.")
    finish_reason: str | None = "stop"
    token_ids: list[int] | None = None


class TokenUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TokenGenerateResponse(BaseModel):
    """Reply of ``POST /inference/v1/generate`` (with ``stream``: SSE chunks of the same shape, then ``[DONE]``)."""

    request_id: str
    choices: list[TokenGenerateChoice]
    usage: TokenUsage | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: None = None
    kv_transfer_params: None = None
    weight_version: WeightVersion | None = Field(
        default=None, description="FleetRL extra: the weight version that generated it (a decimal string, as on "
        "every rollout route: shared.generate_api.WeightVersion).")
