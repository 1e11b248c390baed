"""HTTP wire types of the learner service: ``/health``, ``/status``, ``/checkpoint``, ``/stop``.

Importable without torch (the demo, drills and compose tests read ``/status``). Every error body is the
service kit's envelope (:class:`shared.service_kit.envelope.ErrorResponse`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class LearnerHealth(BaseModel):
    """``GET /health`` (200 healthy; 503, the same body, when the run failed or Redis is unreachable)."""

    status: Literal["ok", "unhealthy"]
    phase: str = Field(description="The run's phase: starting, running, waiting_for_redis, finished, failed ...")
    redis: str | None = Field(default=None, description="\"ok\" or why Redis is unreachable (runs that use it).")
    error: str | None = Field(default=None, description="The run's error, when it failed.")


class LearnerStatus(BaseModel):
    """``GET /status``: where the run stands. The keys below are common to every run; a run adds its own
    (the RL runner: queue, staleness and weight-publish figures), so further keys are allowed."""

    model_config = ConfigDict(extra="allow")

    phase: str = Field(description="starting, waiting_for_start_gate, running, waiting_for_redis, "
                                   "waiting_for_rollout, stopping, stopped, finished, failed.")
    waiting: str | None = Field(default=None, description="What the run waits for (phase waiting_for_rollout: "
                                                          "prompts that no rollout worker takes), in plain words.")
    run_name: str | None = Field(default=None, description="The run's name (its Redis namespace).")
    error: str | None = Field(default=None, description="Why the run failed, if it did.")
    algorithm: str | None = Field(default=None, description="ppo, grpo, reinforce_pp, rloo or sft.")
    step: int | None = Field(default=None, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, description="Steps the run will take.")
    weight_version: int | None = Field(default=None, description="The last weight version published.")
    epoch: int | None = Field(default=None, description="Pass over the prompt set.")
    next_index: int | None = Field(default=None, description="Next prompt-set position to hand out.")
    counters: dict[str, Any] | None = Field(default=None, description="Run counters (samples, drops, ...).")
    last_checkpoint: str | None = Field(default=None, description="Path of the last checkpoint written.")
    last_metrics: dict[str, Any] | None = Field(default=None, description="The last step's metrics.")


class CheckpointResponse(BaseModel):
    """``POST /checkpoint``: a checkpoint was written at a step boundary."""

    step: int = Field(description="The step it holds.")
    path: str = Field(description="Where it was written.")


class StopResponse(BaseModel):
    """``POST /stop`` (202): the run stops at its next step boundary, checkpointing first."""

    stopping: bool
    phase: str = Field(description="The run's phase when the request arrived.")
