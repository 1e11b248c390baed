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

Every field the upstream API defines is accepted, ``null`` meaning the default (:mod:`shared.upstream_fields`:
SGLang's frontend sends its whole ``SamplingParams``); fields no upstream API defines are rejected (HTTP 400 naming
the field), never silently ignored. Optional sampling features (``min_new_tokens``, ``stop_regex``, penalties,
structured outputs, ...) reach the engine, and the service refuses those its engine cannot honour with a 400 naming
field and engine; upstream fields FleetRL has no use for are accepted at their neutral value only (``echo``,
``suffix``, ``logit_bias``, ``lora_path``, ...).

Numbers and text follow :mod:`shared.wire_checks`: strict JSON types (no ``"10"`` for an int, an int is fine
for a float), finite floats, ints the engines hold (token ids and counts in int32, seeds in int64), and text
that is valid UTF-8 in every field. Each violation is a 400 naming the field. Every error body is the
service kit's envelope (:class:`shared.service_kit.envelope.ErrorResponse`).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from shared.upstream_fields import (
    OPENAI_CHAT,
    OPENAI_COMPLETION,
    SGLANG_GENERATE,
    SGLANG_SAMPLING,
    take_upstream,
)
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


class _Upstream(_Strict):
    """A wire model that takes its upstream API's whole schema (:mod:`shared.upstream_fields`): ``null`` means the
    default, upstream-only fields at their neutral value are dropped, others are kept in :meth:`unhonoured` for
    the service to refuse naming its engine; a field the upstream API does not define is still a 400 naming it."""

    _upstream_table: ClassVar[dict[str, Any]] = {}
    _null_not_default: ClassVar[frozenset[str]] = frozenset()  # fields whose null means something of its own
    _unhonoured: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _take_upstream(cls, data: Any, handler):
        if not isinstance(data, dict):
            return handler(data)
        kept, aside = take_upstream(data, cls._upstream_table, set(cls.model_fields),
                                    set(cls.model_fields) - cls._null_not_default)
        model = handler(kept)
        model._unhonoured = aside
        return model

    def unhonoured(self) -> dict[str, Any]:
        """Upstream-only fields set to a value FleetRL cannot honour, with their paths (nested models' included)."""
        out = dict(self._unhonoured)
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, _Upstream):
                out.update({f"{name}.{k}": v for k, v in value.unhonoured().items()})
        return out


GrammarKind = Literal["regex", "json_schema", "ebnf", "json_object"]
"""How a structured-output constraint's spec reads (SGLang's and vLLM's names)."""

GRAMMAR_FIELDS: tuple[GrammarKind, ...] = ("json_schema", "regex", "ebnf")
"""SGLang's structured-output fields of ``sampling_params`` (at most one per request)."""


def _pattern_list(v: str | list[str] | None, what: str) -> list[str]:
    items = [] if v is None else [v] if isinstance(v, str) else list(v)
    for pattern in items:
        if not pattern:
            raise ValueError(f"{what} patterns must be non-empty")
        try:
            regex.compile(pattern)
        except (regex.error, RecursionError, OverflowError) as exc:
            raise ValueError(f"{what} {pattern[:60]!r} is not a valid regular expression: {exc}") from None
    return items


# ---- SGLang /generate ----------------------------------------------------------------------------------
class SamplingParamsIn(_Upstream):
    """``sampling_params`` of ``/generate``: SGLang 0.5.x's ``SamplingParams``, names and defaults; ``null`` means
    the default (``max_new_tokens: null``: the rest of the context). Fields beyond the core (``min_new_tokens``,
    ``stop_regex``, penalties, structured outputs, ...) are applied when the serving engine honours them, else
    refused with a 400 naming the field and the engine."""

    _upstream_table = SGLANG_SAMPLING
    _null_not_default = frozenset({"max_new_tokens"})

    max_new_tokens: StrictInt | None = Field(default=128, ge=0, le=INT32_MAX, description="Tokens to generate at "
                                             "most; 0: the prompt only (SGLang's prefix caching); null: the context.")
    min_new_tokens: StrictInt = Field(default=0, ge=0, le=INT32_MAX, description="No stop ends it before this many.")
    temperature: FiniteFloat = Field(default=1.0, ge=0.0, description="0 means greedy.")
    top_p: FiniteFloat = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(default=-1, ge=-1, le=INT32_MAX, description="-1 (or 0) disables top-k.")
    min_p: FiniteFloat = Field(default=0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = Field(default=None, description="Stop strings (trimmed from the text).")
    stop_token_ids: TokenIds | None = Field(default=None, description="Token ids that end a sequence (kept in output_ids).")
    stop_regex: str | list[str] | None = Field(default=None, description="A match ends the sequence (trimmed like a "
                                               "stop string).")
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = Field(default=False, description="Keep the matched stop string in the text.")
    n: StrictInt = Field(default=1, ge=1, le=_MAX_N, description="Samples per prompt.")
    sampling_seed: StrictInt | None = Field(default=None, ge=0, le=SEED_MAX, description="Sample j of a prompt uses seed + j.")
    frequency_penalty: FiniteFloat = Field(default=0.0, ge=-2.0, le=2.0, description="Minus this times a token's count.")
    presence_penalty: FiniteFloat = Field(default=0.0, ge=-2.0, le=2.0, description="Minus this once a token is out.")
    repetition_penalty: FiniteFloat = Field(default=1.0, gt=0.0, le=2.0, description="1 = none (CTRL's penalty).")
    json_schema: str | None = Field(default=None, description="The text is JSON matching this schema (JSON text).")
    regex: str | None = Field(default=None, description="The text matches this regular expression.")
    ebnf: str | None = Field(default=None, description="The text matches this EBNF grammar.")

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        _stop_list(v)
        return v

    @field_validator("stop_regex")
    @classmethod
    def _stop_regex(cls, v):
        _pattern_list(v, "stop_regex")
        return v

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _ids(cls, v):
        return check_token_ids(v, "stop_token_ids", nested=False)

    @model_validator(mode="after")
    def _checks(self) -> SamplingParamsIn:
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens={self.min_new_tokens} is over max_new_tokens={self.max_new_tokens}")
        given = [f for f in GRAMMAR_FIELDS if getattr(self, f)]
        if len(given) > 1:
            raise ValueError(f"give at most one of {', '.join(GRAMMAR_FIELDS)} (got {', '.join(given)})")
        return self

    def stop_regex_list(self) -> list[str]:
        return _pattern_list(self.stop_regex, "stop_regex")

    def grammar(self) -> tuple[GrammarKind, str] | None:
        """(kind, spec) of the structured output asked for, if any."""
        return next(((f, getattr(self, f)) for f in GRAMMAR_FIELDS if getattr(self, f)), None)


class GenerateRequest(_Upstream):
    """Body of ``POST /generate``: SGLang 0.5.x's ``GenerateReqInput``; exactly one of ``text`` and ``input_ids``,
    single or batch."""

    _upstream_table = SGLANG_GENERATE

    text: str | list[str] | None = None
    input_ids: TokenIds | list[TokenIds] | None = None
    sampling_params: SamplingParamsIn = Field(default_factory=SamplingParamsIn)
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt = Field(
        default=-1, ge=-1, le=INT32_MAX, description="With return_logprob: meta_info.input_token_logprobs holds the "
        "prompt tokens from this position on (position 0: null); -1: none (output tokens only).")
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
        return self.input_ids if self.is_batch else [self.input_ids]  # type: ignore[return-value]  # is_batch narrows


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
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
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


class ResponseFormat(_Strict):
    """OpenAI's ``response_format``: ``text`` (free), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = Field(default=None, description="{name, schema, strict?, description?}.")

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        schema = self.json_schema.get("schema") if isinstance(self.json_schema, dict) else None
        if self.type == "json_schema" and not isinstance(schema, dict):
            raise ValueError("response_format json_schema needs json_schema.schema (a JSON schema object)")
        return self

    def grammar(self) -> tuple[GrammarKind, str] | None:
        """(kind, spec) as SGLang names it, or None for free text."""
        if self.type == "json_schema":
            return "json_schema", json.dumps(self.json_schema["schema"])  # type: ignore[index]
        if self.type == "json_object":
            return "json_object", ""
        return None


class _OpenAICommon(_Upstream):
    """OpenAI's fields plus vLLM's extras; ``null`` means the default (``max_tokens: null``: the context). Other
    fields OpenAI or vLLM define are accepted at their neutral value (:mod:`shared.upstream_fields`)."""

    _null_not_default = frozenset({"max_tokens", "max_completion_tokens"})

    model: str | None = Field(default=None, description="Must name the served model when given.")
    temperature: FiniteFloat = Field(default=1.0, ge=0.0)
    top_p: FiniteFloat = Field(default=1.0, gt=0.0, le=1.0)
    n: StrictInt = Field(default=1, ge=1, le=_MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, le=SEED_MAX)
    user: str | None = None
    presence_penalty: FiniteFloat = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: FiniteFloat = Field(default=0.0, ge=-2.0, le=2.0)
    response_format: ResponseFormat | None = Field(default=None, description="Structured output (OpenAI's shape).")
    # vLLM extras
    repetition_penalty: FiniteFloat = Field(default=1.0, gt=0.0, le=2.0, description="1 = none (CTRL's penalty).")
    top_k: StrictInt = Field(default=-1, ge=-1, le=INT32_MAX)
    min_p: FiniteFloat = Field(default=0.0, ge=0.0, le=1.0)
    min_tokens: StrictInt = Field(default=0, ge=0, le=INT32_MAX, description="No stop ends it before this many tokens.")
    stop_token_ids: TokenIds | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
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
        _only_neutral(self, {"no_stop_trim": False, "return_hidden_states": False})
        _stop_list(self.stop)
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

    def grammar(self) -> tuple[GrammarKind, str] | None:
        return self.response_format.grammar() if self.response_format is not None else None


class CompletionRequest(_OpenAICommon):
    """Body of ``POST /v1/completions``."""

    _upstream_table = OPENAI_COMPLETION

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
            return [p]
        return p  # type: ignore[return-value]  # not text and not one id list: a batch of id lists


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

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v: Any) -> Any:
        """A part of another kind (OpenAI's image_url, input_audio, file) is refused by name: the error would
        otherwise list every alternative of the union."""
        if isinstance(v, list):
            for j, part in enumerate(v):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(f"content[{j}] is a part of type {kind!r}: only text parts ({{type: text, text: ...}}) "
                                     "are served")
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ToolChoiceFunction(_Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(_Strict):
    """OpenAI's ``tool_choice: {"type": "function", "function": {"name": ...}}``: this tool is called."""

    type: Literal["function"]
    function: ToolChoiceFunction


def _tool_parameters(tools: list[dict[str, Any]]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each function tool's name -> (its index in ``tools``, its JSON-schema parameters; ``{}`` reads as any
    object). ValueError naming the field that is wrong."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ValueError(f"tools[{i}]: a forced tool_choice needs function tools ({{type: function, function: "
                             "{name, parameters}}})")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name: a non-empty string is required")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):  # (a ValueError: pydantic turns it into the 400 naming the field)
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object, got "  # noqa: TRY004
                             f"{type(params).__name__}")
        if name in out:
            raise ValueError(f"tools[{i}].function.name: {name!r} is declared twice")
        out[name] = (i, params)
    return out


class ChatCompletionRequest(_OpenAICommon):
    """Body of ``POST /v1/chat/completions``; the prompt is the tokenizer's chat template applied."""

    _upstream_table = OPENAI_CHAT

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=_MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = Field(
        default=None, description="Rendered by the chat template; the model's calls come back as `tool_calls` (the "
        "server's tool_call_parser; not while streaming).")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None, description="`required` or a named function: the reply is tool calls, their arguments "
        "constrained by the tools' parameter schemas (as vLLM does it: the JSON itself, not the model's tool-call "
        "format); not with stream=true.")
    parallel_tool_calls: StrictBool | None = Field(
        default=None, description="false: tool_choice `required` makes exactly one call (default: one or more).")
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
        if self.forced_tool() is not None:
            if not self.tools:
                raise ValueError("tool_choice: a forced tool call needs tools")
            if self.stream:
                raise ValueError("tool_choice: a forced tool call is not supported with stream=true")
            if self.response_format is not None and self.response_format.type != "text":
                raise ValueError("tool_choice: a forced tool call cannot be combined with response_format")
            declared = _tool_parameters(self.tools)
            name = self.forced_tool()
            if name != "required" and name not in declared:
                raise ValueError(f"tool_choice.function.name: {name!r} is not one of the tools "
                                 f"({sorted(declared)})")
        return self

    def forced_tool(self) -> str | None:
        """The tool the reply must call, ``"required"`` (any of them), or None (the model chooses)."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return "required" if self.tool_choice == "required" else None

    def tool_schemas(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """Each tool's name -> (index in ``tools``, parameters schema) (checked by validation when forced)."""
        return _tool_parameters(self.tools or [])

    def grammar(self) -> tuple[GrammarKind, str] | None:
        """A forced tool call's JSON schema: the named tool's parameters, or for ``required`` a non-empty array of
        ``{name, parameters}`` objects, one of the tools each (``parallel_tool_calls: false``: exactly one)."""
        forced = self.forced_tool()
        if forced is None:
            return super().grammar()
        tools = self.tool_schemas()
        if forced != "required":
            schema: dict[str, Any] = dict(tools[forced][1])
        else:
            one_of = [{"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                       "required": ["name", "parameters"], "additionalProperties": False}
                      for name, (_, params) in tools.items()]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": one_of}}
            if self.parallel_tool_calls is False:
                schema["maxItems"] = 1
        # compact JSON (llguidance's keyword, which other validators ignore): a call that is all whitespace between
        # its tokens would run out of tokens before it closes; a schema's own x-guidance wins
        schema.setdefault("x-guidance", {"whitespace_flexible": False})
        return "json_schema", json.dumps(schema)


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
