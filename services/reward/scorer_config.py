"""Typed configuration of each scorer kind, and the scorer plug-in point (:data:`SCORERS`) that maps each
``kind`` to its configuration class and its scorer class.

Pure pydantic (no torch), so settings load and validate before anything heavy is imported.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from services.reward.judge_config import JudgeScorerConfig
from services.reward.scorer_settings_base import RetryConfig, ScorerSettingsBase, _Strict  # noqa: F401 (re-exported)
from shared.model_dir import model_dir_problem
from shared.plugins import PluginPoint

# --- rule checks (a second discriminated union, on `type`) -------------------------------------------


class ExactCheck(_Strict):
    """1.0 when the response (or its extracted answer) equals the label as text, else 0.0."""

    type: Literal["exact"] = "exact"
    extract_answer: bool = Field(default=False, description="Compare the extracted answer (boxed/####/last number).")
    strip: bool = Field(default=True, description="Ignore leading/trailing whitespace.")
    case_sensitive: bool = Field(default=True, description="Compare case-sensitively.")


class MathCheck(_Strict):
    """1.0 when the answer extracted from the response is equivalent to the label, else 0.0.

    Extraction: last ``\\boxed{...}``, else text after the last ``####``, else the last number.
    Numbers compare as exact fractions ("0.5" == "1/2" == "0.50" == "\\frac{1}{2}").
    """

    type: Literal["math"] = "math"
    rel_tol: float = Field(default=0.0, ge=0.0, le=1.0, description="Relative tolerance for numbers (0 = exact).")


class FormatCheck(_Strict):
    """1.0 when the response matches a regular expression (the ``regex`` module, re-compatible), else 0.0."""

    type: Literal["format"] = "format"
    pattern: str = Field(min_length=1, description="Python regular expression.")
    mode: Literal["search", "fullmatch"] = Field(default="search", description="re.search or re.fullmatch.")
    dotall: bool = Field(default=True, description="`.` also matches newlines.")
    match_timeout_s: float = Field(
        default=1.0, gt=0.0, le=60.0, description="A response the pattern cannot decide within this (catastrophic "
        "backtracking) does not have the format: 0.0.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        import regex

        try:
            regex.compile(value)
        except regex.error as exc:
            raise ValueError(f"pattern {value!r} is not a valid regular expression: {exc}") from exc
        return value


class LengthCheck(_Strict):
    """0.0 up to ``max_length``; beyond, ``-penalty * min(1, excess / max_length)``."""

    type: Literal["length"] = "length"
    max_length: int = Field(ge=1, description="Allowed length of the response.")
    unit: Literal["chars", "words"] = Field(default="chars", description="How length is counted.")
    penalty: float = Field(default=1.0, ge=0.0, description="Penalty at twice the allowed length (and beyond).")


RuleCheck = Annotated[ExactCheck | MathCheck | FormatCheck | LengthCheck, Field(discriminator="type")]


# --- scorer kinds ------------------------------------------------------------------------------------


class RuleScorerConfig(ScorerSettingsBase):
    """A rule-based verifier; needs no model."""

    kind: Literal["rule"] = "rule"
    check: RuleCheck


class HfRmScorerConfig(ScorerSettingsBase):
    """A Hugging Face sequence-classification reward model, dynamically batched across requests."""

    kind: Literal["hf_rm"] = "hf_rm"
    model: str = Field(min_length=1, description="Local directory (or hub id) of the checkpoint.")
    device: str = Field(default="auto", description="`auto`, `cpu`, `cuda`, `cuda:1`, ...")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="`auto`: bfloat16 on GPU, float32 on CPU."
    )
    max_batch_size: int = Field(default=32, ge=1, le=4096, description="Most sequences in one forward pass.")
    max_wait_ms: float = Field(default=5.0, ge=0.0, le=10_000.0, description="Longest wait to fill a batch.")
    max_length: int = Field(default=2048, ge=8, description="Tokens kept per sequence (the end is kept).")
    append_eos: bool = Field(
        default=True, description="Strip trailing pad/eos text, then append one eos (as OpenRLHF serve_rm does)."
    )
    head: str = Field(default="score", description="Attribute name of the value head (OpenRLHF value_head_prefix).")
    normalize: bool | None = Field(
        default=None, description="Apply (r - mean) / std from the checkpoint config; None follows its normalize_reward."
    )
    torch_threads: int | None = Field(default=None, ge=1, description="torch intra-op threads on CPU.")

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str) -> str:
        problem = model_dir_problem(v)  # a local checkpoint or an org/name hub id, as the rollout's model
        if problem:
            raise ValueError(problem)
        return v


class PythonScorerConfig(ScorerSettingsBase):
    """A user function by import path, with an explicitly named signature."""

    kind: Literal["python"] = "python"
    function: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description="`package.module:function`.")
    signature: Literal["openrlhf", "verl"] = Field(
        description="`openrlhf`: reward_func(queries, prompts, labels, **kw) -> {'rewards': [...]}; "
        "`verl`: compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {'score': ...}."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for every call.")
    data_source: str = Field(default="", description="verl: data_source when an item's metadata has none.")
    max_workers: int = Field(
        default=4, ge=1, le=256, description="Sync functions: worker processes (or threads), each one call at a "
        "time; async functions: calls at a time.")
    isolation: Literal["process", "thread"] = Field(
        default="process", description="Where a sync function runs: `process` (a call past timeout_s is killed "
        "with its worker, which is replaced) or `thread` (in the service; a stuck call holds its thread).")
    sys_path: list[str] = Field(default_factory=list, description="Directories to add to sys.path before importing.")


class HttpScorerConfig(ScorerSettingsBase):
    """An external reward service: FleetRL ``/score`` or OpenRLHF ``/get_reward``."""

    kind: Literal["http"] = "http"
    url: str = Field(pattern=r"^https?://", description="Full URL of the endpoint, e.g. http://host:5000/get_reward.")
    protocol: Literal["fleetrl", "openrlhf"] = Field(description="Wire protocol of the remote service.")
    max_concurrency: int = Field(default=8, ge=1, le=1024, description="Requests in flight to the remote at most.")
    max_batch_items: int = Field(default=256, ge=1, description="Items per remote request (bigger calls are split).")
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="Extra headers (values are secrets).")
    api_key: SecretStr | None = Field(
        default=None, description="Sent as Authorization: Bearer <api_key>; never logged, shown or put in an error.")
    breaker_failures: int = Field(default=5, ge=1, description="Consecutive failed calls that open the circuit.")
    breaker_reset_s: float = Field(default=10.0, gt=0.0, description="Seconds an open circuit waits before a trial call.")


    @model_validator(mode="after")
    def _one_authorization(self) -> HttpScorerConfig:
        if self.api_key is not None and any(k.lower() == "authorization" for k in self.headers):
            raise ValueError("set api_key or headers.Authorization, not both (api_key is sent as Authorization)")
        return self


#: scorer kinds: settings model -> ``Scorer`` subclass (import paths: torch loads only for hf_rm). Register your
#: own with ``SCORERS.register("mine", MyScorerConfig, "package.module:MyScorer")`` (docs/plugins.md).
SCORERS: PluginPoint[Any] = PluginPoint(
    "scorer", where="reward: scorers[].kind", doc="Reward scorers (services/reward/scorers).",
    base="services.reward.scorers.base:Scorer", settings_base=ScorerSettingsBase)
SCORERS.register("rule", RuleScorerConfig, "services.reward.scorers.rule:RuleScorer")
SCORERS.register("hf_rm", HfRmScorerConfig, "services.reward.scorers.hf_rm:HfRmScorer")
SCORERS.register("python", PythonScorerConfig, "services.reward.scorers.python_fn:PythonScorer")
SCORERS.register("http", HttpScorerConfig, "services.reward.scorers.http_remote:HttpScorer")
SCORERS.register("judge", JudgeScorerConfig, "services.reward.scorers.judge:JudgeScorer")

#: a settings field holding one scorer kind's settings
ScorerConfig = SCORERS.settings_type("ScorerConfig")
