"""Wire types of the rollout service's session routes (control plane: bearer token).

A session records an agent's generation calls (``/sessions/{id}/v1/chat/completions``,
``/sessions/{id}/v1/completions``, ``/sessions/{id}/inference/v1/generate``, or the plain routes with an
``X-Session-ID`` header) as token-exact trajectories; finishing it with a reward (or asking the reward service
for one) pushes them as experiences to the run's experiences stream.

    POST   /sessions                 SessionCreate  -> SessionInfo      (201)
    GET    /sessions/{id}                           -> SessionInfo
    POST   /sessions/{id}/finish     SessionFinish  -> SessionFinished
    DELETE /sessions/{id}                           -> SessionInfo      (dropped, nothing pushed)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from shared.wire_checks import FiniteFloat, StrictBool, StrictInt, Utf8Fields

SESSION_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
RUN_PATTERN = r"^[A-Za-z0-9_.-]+$"


class _Strict(Utf8Fields):
    model_config = ConfigDict(extra="forbid")


class SessionCreate(_Strict):
    """Body of ``POST /sessions``."""

    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN,
                                   description="Your id for it (e.g. a verifiers trace id); default: a random one.")
    prompt_id: str | None = Field(default=None, min_length=1, max_length=512,
                                  description="The task / prompt occurrence; default: the session id.")
    group_id: str | None = Field(default=None, min_length=1, max_length=512, description="Default: prompt_id.")
    group_size: StrictInt = Field(default=1, ge=1, le=1024, description="Sessions in the group (GRPO baseline).")
    index: StrictInt = Field(default=0, ge=0, description="This session's slot in its group.")
    run: str | None = Field(default=None, pattern=RUN_PATTERN, max_length=128,
                            description="Run whose experiences stream receives it; default: this service's run_name.")
    label: Any = Field(default=None, description="Ground truth passed to the reward service (JSON value).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Passed through to the experiences.")
    grant: str | None = Field(default=None, max_length=128, description=(
        "The grant of the learner's prompt task this session answers (PromptTask.grant, copied as is): the learner "
        "trains only groups it issued, so a session without its task's grant is not trained on."))

    @model_validator(mode="after")
    def _slot(self) -> SessionCreate:
        if self.index >= self.group_size:
            raise ValueError(f"index {self.index} is outside a group of size {self.group_size}")
        return self


class SessionInfo(_Strict):
    session_id: str
    state: Literal["open", "finished", "deleted"]
    prompt_id: str
    group_id: str
    group_size: int
    index: int
    run: str
    calls: int = Field(description="Generation calls recorded.")
    trajectories: int = Field(description="Trajectories they make (a call not extending the last one starts one).")
    tokens: int = Field(description="Tokens held (prompts and responses of every trajectory).")
    idle_expires_in_s: float = Field(description="Expires when idle this much longer.")
    openai_base_url: str = Field(description="Path to give an OpenAI client as base_url (append to the server URL).")
    api_key: str | None = Field(default=None, description="The key of this session's calls (Authorization: Bearer "
                                "<api_key>; the OpenAI client's api_key): it opens this session only. None without "
                                "a control token.")
    replica_url: str | None = Field(default=None, description="Base URL of the rollout replica holding the session "
                                    "(its advertise_url): behind a load balancer, send the session's calls to "
                                    "replica_url + openai_base_url; other replicas redirect them there.")


class SessionFinish(_Strict):
    """Body of ``POST /sessions/{id}/finish``: a reward, or ``score: true`` to ask the reward service."""

    reward: FiniteFloat | None = Field(default=None, description="The trajectory's reward (every trajectory of it).")
    reward_components: dict[str, FiniteFloat] = Field(default_factory=dict)
    score: StrictBool = Field(default=False, description="Score each trajectory with the reward service instead.")

    @model_validator(mode="after")
    def _one(self) -> SessionFinish:
        if (self.reward is None) == (not self.score):
            raise ValueError("give exactly one of `reward` and `score: true`")
        return self


class SessionFinished(_Strict):
    session_id: str
    experience_ids: list[str] = Field(description="Pushed to the run's experiences stream, one per trajectory.")
    rewards: list[float]
    stream: str = Field(description="The Redis stream they went to.")
