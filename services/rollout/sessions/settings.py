"""Settings of session mode (``sessions`` in the rollout's settings; env ``FLEETRL_ROLLOUT_SESSIONS__<KEY>``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class SessionSettings(BaseModel):
    """Session mode: an agent's OpenAI / token-in calls recorded as trajectories, pushed as experiences."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="Serve /sessions/* and record calls that name a session "
                                                      "(needs redis_url: finished sessions go to the run's experiences).")
    ttl_s: float = Field(default=600.0, gt=0, le=7 * 86400,
                         description="A session idle this long expires: dropped, counted, never pushed.")
    max_sessions: int = Field(default=1024, ge=1, description="Open sessions at most; creating more answers 429.")
    max_calls: int = Field(default=512, ge=1, description="Generation calls in one session at most (then 409).")
    max_tokens: int = Field(default=131072, ge=1, description="Tokens one session holds at most (prompts and outputs "
                            "of its trajectories); a call once it holds this many is a 409: finish it.")
    sweep_interval_s: float = Field(default=5.0, gt=0, description="How often expired sessions are swept.")
    remember_finished: int = Field(
        default=16384, ge=0, description="Finished / expired session ids remembered (to answer 409 / say 'expired' "
                                         "rather than 404); the oldest are forgotten first.")
    unknown_header_id: Literal["reject", "ignore", "open"] = Field(
        default="reject", description="An X-Session-ID header naming no session: reject (404), ignore (a routing hint "
                                      "only, as vLLM treats it), or open a session with that id (defaults, group of one).")
    reward_url: str | None = Field(default=None, description="Reward service base URL for finish with score=true; "
                                                             "default: worker.reward_url.")
    reward_token: SecretStr | None = Field(default=None, description="The reward service's auth_token; default: "
                                           "worker.reward_token when reward_url is unset (the same service).")
    reward_timeout_s: float = Field(default=60.0, gt=0, description="Finish waits this long for the reward service.")
    push_timeout_s: float = Field(default=30.0, gt=0, description="Finish waits this long for room in the experiences "
                                                                 "stream (backpressure), then answers 503.")
