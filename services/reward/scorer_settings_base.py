"""The settings every scorer kind shares (name, weight, error policy, timeout, retries). Its own module so that
scorer kinds whose settings live in their own files (``judge_config``) import it without a cycle through
:mod:`services.reward.scorer_config`, which registers them. Pure pydantic."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryConfig(_Strict):
    """How a failing scorer call is retried before the failure policy applies."""

    attempts: int = Field(default=3, ge=1, le=20, description="Tries in all (1 = no retry).")
    backoff_s: float = Field(default=0.2, ge=0.0, le=60.0, description="First wait between tries; doubles each time.")
    max_backoff_s: float = Field(default=5.0, ge=0.0, le=600.0, description="Longest wait between tries.")
    max_total_s: float = Field(
        default=300.0, gt=0.0, le=86_400.0, description="All tries of one call within this: no try starts (or waits) "
        "past it, and the last try's timeout is cut to what is left.")


class ScorerSettingsBase(_Strict):
    """Fields every scorer kind has (subclass it for your own scorer's settings)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Unique name; the key of this scorer's component.")
    weight: float = Field(default=1.0, description="Factor of this scorer's value in the final reward.")
    on_error: Literal["fail", "mark"] = Field(
        default="fail",
        description="After retries: `fail` fails the request (502/503/504); `mark` answers with score null "
        "and an entry in `errors` for the affected items. Never a silent 0.0.",
    )
    timeout_s: float = Field(default=60.0, gt=0.0, le=3600.0, description="Limit of one scoring call (one try).")
    retry: RetryConfig = Field(default_factory=RetryConfig)
