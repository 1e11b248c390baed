"""HTTP wire types of the rollout service: SGLang-compatible ``/generate`` and the OpenAI routes.

Importable without torch (clients, the learner and tests build requests and read replies with it).

``POST /generate`` follows SGLang's ``GenerateReqInput`` field for field (see engine-apis.md): a
client written for SGLang works unchanged. ``weight_version`` is a string holding an integer, as
SGLang sends it, on every route of the rollout service (:data:`WeightVersion`). Batch input (a list of texts or of id lists) and ``n > 1`` give a list of results,
prompt-major: result ``i * n + j`` is sample ``j`` of prompt ``i``.

``/v1/completions`` and ``/v1/chat/completions`` follow OpenAI, plus vLLM's extras (``top_k``,
``min_p``, ``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``, ``return_token_ids``, ...), so
agents keep token-level fidelity: ``return_token_ids`` adds ``prompt_token_ids`` and per-choice
``token_ids``; a completion prompt given as token ids is used as is.

Unknown fields are rejected (HTTP 400 naming the field), never silently ignored. Fields FleetRL cannot
honour (the penalties of :data:`PENALTIES` on every route, OpenAI's ``logit_bias``, ``echo``, ``suffix``) are
accepted only at their neutral value: clients that send every default work, any other value is a 400 naming it.

Numbers and text follow :mod:`shared.wire_checks`: strict JSON types (no ``"10"`` for an int, an int is fine
for a float), finite floats, ints the engines hold (token ids and counts in int32, seeds in int64), and text
that is valid UTF-8 in every field. Each violation is a 400 naming the field. Every error body is the
service kit's envelope (:class:`shared.service_kit.envelope.ErrorResponse`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.wire_checks import (
    INT32_MAX,
    SEED_MAX,
    FiniteFloat,
    StrictBool,
    StrictInt,
    Utf8Fields,
    check_token_ids,
)

WeightVersion = str
"""A weight version on the rollout service's wire: the learner's integer version as a decimal string ("3"), on every
route (``/generate`` meta_info, ``/model_info``, ``/health``, the OpenAI routes' ``weight_version`` and SGLang's
``metadata.weight_version``, ``/inference/v1/generate``). SGLang's own type (its ``meta_info.weight_version`` and
``/get_model_info`` are strings, and clients written for it compare strings), so one type serves both; ``int(v)``
gives the number. Inside FleetRL (experiences, Redis, the learner's ``/status``) the version is an int."""

_MAX_TOP_LOGPROBS = 20
_MAX_N = 1024

TokenIds = list[StrictInt]


class _Strict(Utf8Fields):
    model_config = ConfigDict(extra="forbid")


def _stop_list(v: str | list[str] | None) -> list[str]:
    if v is None:
        return []
    items = [v] if isinstance(v, str) else list(v)
    if any(not s for s in items):
        raise ValueError("stop strings must be non-empty")
    return items


def _only_neutral(model: BaseModel, fields: dict[str, Any]) -> None:
    """SGLang-schema fields FleetRL accepts (routers such as sglang-router re-send the whole schema) but
    supports only at their neutral value: anything else is a clear 400, never silently ignored."""
    for name, neutral in fields.items():
        value = getattr(model, name)
        if value != neutral:
            raise ValueError(f"{name}={value!r} is not supported by this server (leave it at {neutral!r})")


PENALTIES = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
"""Sampling penalties (SGLang's and vLLM's names) and their neutral values: every generation route accepts them
at these values (clients such as sglang-router and OpenAI SDK wrappers send every default) and refuses any
other value with a 400 naming the field, since no engine path here applies them."""


# ---- SGLang /generate ----------------------------------------------------------------------------------
class SamplingParamsIn(_Strict):
    """``sampling_params`` of ``/generate`` (SGLang names and defaults)."""

    max_new_tokens: StrictInt = Field(default=128, ge=1, le=INT32_MAX, description="Tokens to generate at most.")
    temperature: FiniteFloat = Field(default=1.0, ge=0.0, description="0 means greedy.")
    top_p: FiniteFloat = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(default=-1, ge=-1, le=INT32_MAX, description="-1 (or 0) disables top-k.")
    min_p: FiniteFloat = Field(default=0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None, description="Stop strings (trimmed from the text).")
    stop_token_ids: TokenIds | None = Field(default=None, description="Token ids that end a sequence (kept in output_ids).")
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = Field(default=False, description="Keep the matched stop string in the text.")
    n: StrictInt = Field(default=1, ge=1, le=_MAX_N, description="Samples per prompt.")
    sampling_seed: StrictInt | None = Field(default=None, ge=0, le=SEED_MAX, description="Sample j of a prompt uses seed + j.")
    # SGLang's penalties, which clients that send every default send: accepted at their neutral value only.
    frequency_penalty: FiniteFloat = Field(default=0.0, description="Only 0 (no penalty) is supported.")
    presence_penalty: FiniteFloat = Field(default=0.0, description="Only 0 (no penalty) is supported.")
    repetition_penalty: FiniteFloat = Field(default=1.0, description="Only 1 (no penalty) is supported.")

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        _stop_list(v)
        return v

    @model_validator(mode="after")
    def _neutral_only(self) -> SamplingParamsIn:
        _only_neutral(self, PENALTIES)
        return self

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _ids(cls, v):
        return check_token_ids(v, "stop_token_ids", nested=False)


class GenerateRequest(_Strict):
    """Body of ``POST /generate``: exactly one of ``text`` and ``input_ids``, single or batch."""

    text: str | list[str] | None = None
    input_ids: TokenIds | list[TokenIds] | None = None
    sampling_params: SamplingParamsIn = Field(default_factory=SamplingParamsIn)
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt = Field(default=-1, description="Only -1 (logprobs of output tokens) is supported.")
    top_logprobs_num: StrictInt = Field(default=0, ge=0, le=_MAX_TOP_LOGPROBS)
    return_text_in_logprobs: StrictBool = False
    stream: StrictBool = False
    rid: str | list[str] | None = Field(default=None, description="Request id(s); generated when absent.")
    # Accepted for SGLang-client / sglang-router compatibility; informational or neutral-only.
    model: str | None = Field(default=None, description="Ignored by /generate (SGLang serves one model).")
    log_metrics: StrictBool = Field(default=True, description="Accepted; metrics are always recorded.")
    no_logs: StrictBool = Field(default=False, description="Accepted; requests are never logged with their text.")
    return_hidden_states: StrictBool = False
    return_entropy: StrictBool = False
    return_bytes: StrictBool = False
    background: StrictBool = False

    @field_validator("input_ids", mode="before")
    @classmethod
    def _input_ids(cls, v):
        return check_token_ids(v, "input_ids", nested=True)

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        _only_neutral(self, {"return_hidden_states": False, "return_entropy": False, "return_bytes": False,
                             "background": False})
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of `text` and `input_ids`")
        if isinstance(self.text, str) and not self.text:
            raise ValueError("`text` is empty")
        if isinstance(self.text, list) and (not self.text or any(not t for t in self.text)):
            raise ValueError("`text` batch must be non-empty and hold non-empty strings")
        if self.input_ids is not None:
            rows = self.input_ids if self.input_ids and isinstance(self.input_ids[0], list) else [self.input_ids]
            if not rows or any(not r for r in rows):
                raise ValueError("`input_ids` is empty")
        if self.logprob_start_len != -1:
            raise ValueError("logprob_start_len: only -1 (logprobs of the output tokens) is supported")
        if isinstance(self.rid, list) and len(self.rid) != len(self.prompts_raw()):
            raise ValueError(f"`rid` has {len(self.rid)} ids for {len(self.prompts_raw())} prompts")
        return self

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return self.input_ids is not None and bool(self.input_ids) and isinstance(self.input_ids[0], list)

    def prompts_raw(self) -> list[str] | list[list[int]]:
        """The prompts as a list (texts or id lists)."""
        if self.text is not None:
            return self.text if isinstance(self.text, list) else [self.text]
        return self.input_ids if self.is_batch else [self.input_ids]  # type: ignore[list-item,return-value]


class MetaInfo(BaseModel):
    id: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish_reason: dict[str, Any] | None
    weight_version: WeightVersion
    weight_version_spans: list[tuple[int, int]] | None = Field(
        default=None, description="FleetRL: [(first output token, weight version), ...] when the weights changed "
        "while this sequence was generated (partial rollouts); weight_version is then the oldest.")
    e2e_latency: float | None = None
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float, int, str | None]]] | None = None


class GenerateResponse(BaseModel):
    """One result of ``/generate`` (a batch or ``n > 1`` answers a list of these)."""

    text: str
    output_ids: list[int]
    meta_info: MetaInfo


# ---- OpenAI ---------------------------------------------------------------------------------------------
class StreamOptions(_Strict):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class _OpenAICommon(_Strict):
    model: str | None = Field(default=None, description="Must name the served model when given.")
    temperature: FiniteFloat = Field(default=1.0, ge=0.0)
    top_p: FiniteFloat = Field(default=1.0, gt=0.0, le=1.0)
    n: StrictInt = Field(default=1, ge=1, le=_MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=SEED_MAX)
    user: str | None = None
    presence_penalty: FiniteFloat = 0.0
    frequency_penalty: FiniteFloat = 0.0
    logit_bias: dict[str, FiniteFloat] | None = None
    # vLLM extras
    repetition_penalty: FiniteFloat = Field(default=1.0, description="Only 1 (no penalty) is supported.")
    top_k: StrictInt = Field(default=-1, ge=-1, le=INT32_MAX)
    min_p: FiniteFloat = Field(default=0.0, ge=0.0, le=1.0)
    stop_token_ids: TokenIds | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    return_token_ids: StrictBool = Field(default=False, description="Add prompt_token_ids and per-choice token_ids (vLLM).")
    return_tokens_as_token_ids: StrictBool = Field(default=False, description="Logprob tokens as 'token_id:<id>' (vLLM).")
    # SGLang extras that sglang-router re-sends: accepted at their neutral value only.
    no_stop_trim: StrictBool = False
    return_hidden_states: StrictBool = False

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_ids(cls, v):
        return check_token_ids(v, "stop_token_ids", nested=False)

    @model_validator(mode="after")
    def _neutral_only(self):
        _only_neutral(self, {"no_stop_trim": False, "return_hidden_states": False, **PENALTIES})
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        _stop_list(self.stop)
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self


class CompletionRequest(_OpenAICommon):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: StrictInt | None = Field(default=16, ge=1, le=INT32_MAX)
    logprobs: StrictInt | None = Field(default=None, ge=0, le=_MAX_TOP_LOGPROBS, description="Top alternatives per token.")
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = Field(default=None, ge=1, le=_MAX_N)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_ids(cls, v):
        return check_token_ids(v, "prompt", nested=True)

    @model_validator(mode="after")
    def _checks(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo=true is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of must equal n (or be left out)")
        p = self.prompt
        if p == "" or p == [] or (isinstance(p, list) and any(x == "" or x == [] for x in p)):
            raise ValueError("`prompt` is empty")
        return self

    def prompts_raw(self) -> list[str] | list[list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return p  # type: ignore[return-value]


class TextPart(BaseModel):
    """A text part of a message's content (its text is checked by the message, which names the field)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessageIn(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_OpenAICommon):
    """Body of ``POST /v1/chat/completions``; the prompt is the tokenizer's chat template applied."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=_MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="Rendered by the chat template; the model's calls come back as `tool_calls` (the "
        "server's tool_call_parser; not while streaming).")
    tool_choice: Literal["none", "auto"] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # SGLang's chat extras (sglang-router sends them): no reasoning parser runs here, so they have no effect.
    separate_reasoning: StrictBool = True
    stream_reasoning: StrictBool = True

    @model_validator(mode="after")
    def _checks(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt=false")
        return self


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    weight_version: WeightVersion | None = Field(default=None, description="FleetRL extra: the weight version that "
                                                 "generated it (the newest of the choices').")
    metadata: dict[str, WeightVersion] | None = Field(default=None, description="SGLang's: {'weight_version': ...}.")


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None, description="Calls read from the model's text when the request declared tools (OpenAI's shape).")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    weight_version: WeightVersion | None = Field(default=None, description="As CompletionResponse's.")
    metadata: dict[str, WeightVersion] | None = Field(default=None, description="SGLang's: {'weight_version': ...}.")


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None, description="Calls read from the streamed text when the request declared tools: OpenAI's "
                                  "streamed shape (`index`, `id`, `type`, `function.name`, `function.arguments`).")


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fleetrl"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ModelInfo(BaseModel):
    """``GET /model_info`` (SGLang's keys plus the engine)."""

    model_path: str
    tokenizer_path: str
    is_generation: bool = True
    weight_version: WeightVersion
    engine: str
    served_model_name: str
    context_length: int
    paused: bool


class RolloutHealth(BaseModel):
    """``GET /health`` and ``GET /health_generate`` (200 healthy, 503 not: the same body)."""

    status: Literal["ok", "unhealthy"]
    paused: bool = Field(description="Generation is paused (control plane or a weight update).")
    weight_version: WeightVersion = Field(description="The weight version the engine generates with.")


class ControlReply(BaseModel):
    """The answer of a control route (``/pause_generation``, ``/continue_generation``), as SGLang's."""

    success: bool
    message: str
