"""DAPO's dynamic sampling settings (no torch import): used by the RL algorithms and the online preference ones."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DynamicSamplingSettings(BaseModel):
    """DAPO's dynamic sampling: complete groups whose rewards are all equal carry no group-relative signal; drop
    them (their dataset position is done) so that fresh prompts fill the step's batch."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=False, description="Drop zero-variance groups and fill the batch with fresh ones.")
    max_refills_per_step: int = Field(
        default=16, ge=0, description="Groups dropped per training step at most; past it, zero-variance groups are "
        "trained (counted as dynamic_sampling_cap_reached) so a task the policy always solves or always fails "
        "cannot starve the run.")
