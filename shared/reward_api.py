"""HTTP wire types of the reward service: ``POST /score`` (FleetRL) and ``POST /get_reward`` (OpenRLHF).

Importable without torch, so rollout workers and the learner can build requests and read replies.

``/score``::

    ScoreRequest(items=[ScoreItem(prompt="1+1=", response="2", label="2")])
    -> ScoreResponse(scores=[1.0], components=[{"math": 1.0}], errors=[])

``scores[i]`` is the weighted sum of the scorers' values for item ``i``; ``components[i]`` holds each
scorer's own (unweighted) value. A scorer configured with ``on_error: mark`` that failed leaves
``None`` in both places and an ``ItemError`` in ``errors`` — a failure is never reported as 0.0.

``/get_reward`` is OpenRLHF's remote reward-model protocol (``openrlhf.cli.serve_rm``): request
``{"query", "prompts", "labels"}`` (only ``query`` required), reply ``{"rewards", "scores", "extra_logs"}``.

Every text in a request (prompt, response, chat content, labels and metadata included) must be valid UTF-8:
a lone surrogate (JSON ``"\ud800"``) is refused naming the field (:mod:`shared.wire_checks`), since reward
models' tokenizers and remote scorers' JSON encoders cannot take it.

Every error body is the service kit's envelope (:class:`shared.service_kit.envelope.ErrorResponse`); when
scorers failed, its ``errors`` holds one ``{"scorer", "error"}`` record per scorer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.schemas import ChatMessage
from shared.wire_checks import Utf8Fields

Prompt = str | list[ChatMessage]


class ScoreItem(Utf8Fields):
    """One (prompt, response) pair to score."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: Prompt = Field(description="Prompt text, or chat messages (OpenAI style).")
    response: str = Field(description="The generated response text (without the prompt).")
    label: Any = Field(default=None, description="Ground truth for verifiers (JSON value); None when there is none.")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form; the python scorer's verl signature reads `data_source` and `extra_info` from it.",
    )


class ScoreRequest(BaseModel):
    """Body of ``POST /score``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: list[ScoreItem] = Field(min_length=1, description="Items to score; replies keep this order.")


class ItemError(BaseModel):
    """A scorer failed for item ``index`` and its config says ``on_error: mark``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="Position of the item in the request.")
    scorer: str = Field(description="Name of the scorer that failed.")
    error: str = Field(description="What went wrong.")


class ScoreResponse(BaseModel):
    """Body of the ``POST /score`` reply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scores: list[float | None] = Field(description="Final reward per item; None only for an item in `errors`.")
    components: list[dict[str, float | None]] = Field(description="Per item: scorer name -> unweighted value.")
    errors: list[ItemError] = Field(default_factory=list, description="Marked failures (on_error: mark).")

    @model_validator(mode="after")
    def _aligned(self) -> ScoreResponse:
        if len(self.scores) != len(self.components):
            raise ValueError(f"{len(self.scores)} scores but {len(self.components)} component rows")
        return self

    def scored(self) -> list[tuple[float, dict[str, float]]]:
        """Each item's score and the values its scorers gave; ValueError naming the first item without a score
        (a marked failure: a caller that needs every score checks ``errors`` first)."""
        out = []
        for k, (score, components) in enumerate(zip(self.scores, self.components)):
            if score is None:
                raise ValueError(f"item {k} has no score ({len(self.errors)} marked failure(s))")
            out.append((float(score), {name: float(v) for name, v in components.items() if v is not None}))
        return out


class GetRewardRequest(Utf8Fields):
    """Body of ``POST /get_reward`` (OpenRLHF). ``query`` is prompt + response text.

    Unknown keys are ignored (not rejected) so newer OpenRLHF trainers that send more keep working.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    query: list[str] = Field(min_length=1, description="prompt + response, one string per sample.")
    prompts: list[str] | None = Field(default=None, description="The prompt of each query (a prefix of it).")
    labels: list[Any] | None = Field(default=None, description="Ground truth per query.")

    @model_validator(mode="after")
    def _aligned(self) -> GetRewardRequest:
        n = len(self.query)
        for name in ("prompts", "labels"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"`{name}` has {len(value)} entries but `query` has {n}; they must align one to one")
        return self


class GetRewardResponse(BaseModel):
    """Body of the ``POST /get_reward`` reply (OpenRLHF reads ``rewards``, ``scores`` and ``extra_logs``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rewards: list[float] = Field(description="Final reward per query.")
    scores: list[float] = Field(description="Same as rewards (OpenRLHF uses it for filtering and logging).")
    extra_logs: dict[str, list[float]] = Field(
        default_factory=dict, description="Per scorer name, its unweighted value per query."
    )


class ScorerFailing(BaseModel):
    """A scorer whose calls have failed since its last success (``GET /health``'s ``failing``)."""

    where: str = Field(description="The scorer as errors name it: reward scorer 'name' at URL (or (kind)).")
    for_s: float = Field(ge=0.0, description="Seconds since the first failed call after its last success.")
    error: str = Field(description="The last failure's cause.")


class RewardHealth(BaseModel):
    """``GET /health`` (200 when every scorer's check passed, else 503: the same body)."""

    status: Literal["ok", "unhealthy"]
    scorers: dict[str, str] = Field(description="Per scorer: \"ok\", or what its check said.")
    failing: dict[str, ScorerFailing] = Field(
        default_factory=dict, description="Per scorer whose calls fail now: since when and why (none: all fine).")


class ScorerInfo(BaseModel):
    """One configured scorer as ``GET /scorers`` shows it: what it is, never how it is set up (no kwargs,
    URLs, headers, keys or model paths)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="The scorer's name (its key in `components`).")
    kind: str = Field(description="rule, hf_rm, python or http.")
    weight: float = Field(description="Factor of its value in the final reward.")
    on_error: str = Field(description="What a failure does after retries: fail or mark.")


class ScorersResponse(BaseModel):
    """``GET /scorers``: the configured scorers, by name and kind."""

    scorers: list[ScorerInfo] = Field(description="Each scorer, in configuration order.")
