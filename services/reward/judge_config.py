"""Settings of the ``judge`` scorer kind: an LLM judge behind any OpenAI-compatible chat endpoint.

Pure pydantic (the template is parsed here so a bad one fails when the settings load, naming the brace).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from services.reward.scorer_settings_base import ScorerSettingsBase, _Strict
from services.reward.scorers.judge_template import parse_template

# --- parsers: the judge's text -> a score (a second discriminated union, on `type`) -----------------------


class _Range(_Strict):
    min: float = Field(default=0.0, description="Lowest score the judge may give; a value below is unreadable.")
    max: float = Field(default=10.0, description="Highest score the judge may give; a value above is unreadable.")
    normalize: bool = Field(default=False, description="Map [min, max] onto [0, 1] (pairwise mode always does).")

    @model_validator(mode="after")
    def _ordered(self):
        if not self.min < self.max:
            raise ValueError(f"parser min ({self.min}) must be below max ({self.max})")
        return self


class NumberParser(_Range):
    """A number: the first group of ``pattern`` (its last match), else the last number in the reply.

    Group mode reads one ``k: score`` line per response (``pattern_many``)."""

    type: Literal["number"] = "number"
    pattern: str | None = Field(
        default=None, description="Regex whose group 1 is the number (last match wins), e.g. 'Score:\\s*(\\d+)'; "
        "unset: the last number in the reply.")
    pattern_many: str = Field(
        default=r"(?im)^\W*(?:response|sample)?\s*#?\s*(\d+)\s*\W*\s*[:=\-]\s*([-+]?\d+(?:\.\d+)?)",
        description="Group mode: regex with group 1 = response number (from 1) and group 2 = its score.")

    @field_validator("pattern", "pattern_many")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        import re

        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"pattern {value!r} is not a valid regular expression: {exc}") from exc
        return value


class JsonParser(_Range):
    """A field of the first JSON object in the reply (a ```json fence is fine): a number or a boolean (1/0);
    in group mode a list with one score per response (or a ranking)."""

    type: Literal["json"] = "json"
    field: str = Field(default="score", pattern=r"^[A-Za-z0-9_.-]+$",
                       description="Dotted path of the field, e.g. `score` or `verdict.score`.")


class BoxedParser(_Range):
    """The last ``\\boxed{...}``: a number in [min, max], or a verdict looked up in ``map``; in group mode
    comma-separated values (or a ranking such as ``\\boxed{2, 1, 3}``)."""

    type: Literal["boxed"] = "boxed"
    map: dict[str, float] = Field(default_factory=dict,
                                  description="Verdict -> score (case-insensitive), e.g. {correct: 1, incorrect: 0}; "
                                  "empty: the box holds a number.")


class LabelParser(_Strict):
    """A verdict word: the last of ``map``'s keys in the reply (as a whole word) gives its score; in group mode
    one ``k: VERDICT`` line per response."""

    type: Literal["labels"] = "labels"
    map: dict[str, float] = Field(min_length=1, description="Verdict -> score, e.g. {A: 1, B: 0, tie: 0.5}.")
    case_sensitive: bool = Field(default=False, description="Match verdicts case-sensitively.")


JudgeParser = Annotated[NumberParser | JsonParser | BoxedParser | LabelParser, Field(discriminator="type")]


# --- the rest of the judge's settings ----------------------------------------------------------------------


class JudgeSampling(_Strict):
    """Sampling settings of every judge call (part of the cache key)."""

    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0 = greedy: the same judgment again.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling.")
    max_tokens: int = Field(default=256, ge=1, le=32_768, description="Longest judgment, in tokens.")
    seed: int | None = Field(default=None, description="Sent as `seed` when set (endpoints that honour it).")
    stop: list[str] = Field(default_factory=list, max_length=4, description="Stop strings.")


class JudgeCache(_Strict):
    """Where judgments are kept, so identical work is not paid twice."""

    size: int = Field(default=65_536, ge=0, le=10_000_000, description="Judgments in the in-memory LRU (0 = none).")
    redis_url: SecretStr | None = Field(
        default=None, description="Also keep judgments in this Redis (e.g. the run's), so a restarted service or a "
        "resumed run does not pay again; may hold a password (never shown).")
    ttl_s: float = Field(default=7 * 86_400.0, gt=0.0, description="How long a judgment stays in Redis.")
    prefix: str = Field(default="fleetrl:judge:", min_length=1, description="Prefix of the Redis keys.")
    redis_timeout_s: float = Field(default=2.0, gt=0.0, le=60.0,
                                   description="Limit of one Redis call; a slow or down Redis is a cache miss.")


class JudgeBudget(_Strict):
    """What the judge may spend in this service's life (one run); past it every judge call is refused."""

    max_calls: int | None = Field(default=None, ge=1, description="Judge calls at most (unset: no limit).")
    max_tokens: int | None = Field(
        default=None, ge=1, description="Tokens (prompt + completion, from the endpoint's `usage`) at most; calls in "
        "flight when it is reached still finish (unset: no limit).")


class JudgeScorerConfig(ScorerSettingsBase):
    """An LLM judge behind an OpenAI-compatible ``/v1/chat/completions`` (a FleetRL rollout service, vLLM,
    SGLang, a hosted API)."""

    kind: Literal["judge"] = "judge"
    url: str = Field(pattern=r"^https?://", description="Full URL of the chat endpoint, e.g. "
                     "http://judge:8001/v1/chat/completions.")
    model: str = Field(min_length=1, description="`model` sent in each request.")
    api_key: SecretStr | None = Field(
        default=None, description="Sent as Authorization: Bearer <api_key>; never logged, shown or put in an error.")
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="Extra headers (values are secrets).")
    mode: Literal["pointwise", "group", "pairwise"] = Field(
        default="pointwise", description="`pointwise`: one call per response; `group`: one call per group with all "
        "its responses; `pairwise`: one call per pair of a group's responses, a response's score is its win rate.")
    system: str = Field(default="", description="System message (empty: none). Plain text, no placeholders.")
    template: str = Field(
        min_length=1, description="User message with {prompt}, {response}, {label} (pointwise), {responses} and {n} "
        "(group), {response_a} and {response_b} (pairwise); {{ and }} for literal braces. Request text is inserted "
        "as data, never expanded.")
    parser: JudgeParser = Field(description="How the judge's reply becomes a score.")
    group_output: Literal["scores", "ranking"] = Field(
        default="scores", description="Group mode: the judge gives one score per response, or a ranking (best "
        "first, response numbers from 1) turned into rewards from 1 (best) down to 0 (worst).")
    group_by: Literal["prompt", "metadata"] = Field(
        default="prompt", description="Group and pairwise modes: items with the same prompt and label form a "
        "group (what one rollout worker /score call of a group sends), or the same `metadata[group_key]`.")
    group_key: str = Field(default="group_id", min_length=1, description="Metadata key of group_by: metadata.")
    max_group_size: int = Field(default=64, ge=2, le=1024,
                                description="A bigger group is judged in parts of at most this many responses.")
    swap: bool = Field(default=False, description="Pairwise: judge each pair in both orders (cancels position bias; "
                       "twice the calls).")
    response_extract: str | None = Field(
        default=None, description="Regex; the judge sees only group 1 (or the whole match) of its last match in the "
        "response, e.g. the final answer (identical answers then merge); no match: the whole response.")
    max_response_chars: int = Field(default=16_000, ge=16, le=1_000_000,
                                    description="A longer response is cut to this many characters (head kept).")
    sampling: JudgeSampling = Field(default_factory=JudgeSampling)
    max_retries: int = Field(default=2, ge=0, le=10,
                             description="Extra judge calls for a judgment the parser cannot read.")
    dedup: bool = Field(default=True, description="Judge identical work (same prompt, response, label) once per batch "
                        "and share calls in flight.")
    cache: JudgeCache = Field(default_factory=JudgeCache)
    budget: JudgeBudget = Field(default_factory=JudgeBudget)
    max_concurrency: int = Field(default=32, ge=1, le=4096, description="Judge calls in flight to the endpoint.")
    breaker_failures: int = Field(default=5, ge=1, description="Consecutive failed calls that open the circuit.")
    breaker_reset_s: float = Field(default=10.0, gt=0.0, description="Seconds an open circuit waits before a trial.")

    @field_validator("response_extract")
    @classmethod
    def _extract_compiles(cls, value: str | None) -> str | None:
        import re

        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"response_extract {value!r} is not a valid regular expression: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _fits_mode(self) -> JudgeScorerConfig:
        names = parse_template(self.template).names  # ValueError names the bad brace
        need = {"pointwise": {"response"}, "group": {"responses"}, "pairwise": {"response_a", "response_b"}}[self.mode]
        allowed = {"pointwise": {"prompt", "response", "label"}, "group": {"prompt", "label", "responses", "n"},
                   "pairwise": {"prompt", "label", "response_a", "response_b"}}[self.mode]
        if not need <= names:
            raise ValueError(f"mode {self.mode!r} needs {', '.join('{' + n + '}' for n in sorted(need))} in the "
                             "template")
        if names - allowed:
            raise ValueError(f"mode {self.mode!r} has no {', '.join('{' + n + '}' for n in sorted(names - allowed))}; "
                             f"its placeholders are {', '.join('{' + n + '}' for n in sorted(allowed))}")
        if self.mode == "group" and self.group_output == "ranking" and self.parser.type not in ("json", "boxed"):
            raise ValueError("group_output ranking reads a list of response numbers: use parser type json (a list "
                             "field) or boxed (\\boxed{2, 1, 3})")
        if self.mode == "pairwise" and isinstance(self.parser, LabelParser) and any(
                not 0.0 <= v <= 1.0 for v in self.parser.map.values()):
            raise ValueError("pairwise: the labels parser's scores are the chance that response A is better, so each "
                             "must be in [0, 1] (e.g. {A: 1, B: 0, tie: 0.5})")
        if self.api_key is not None and any(k.lower() == "authorization" for k in self.headers):
            raise ValueError("set api_key or headers.Authorization, not both (api_key is sent as Authorization)")
        return self
