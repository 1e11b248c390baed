"""The worker's default sampling (``worker.sampling``). The rest of the ``worker`` section is put together in
``services/rollout/settings.py``: it holds the agents' sections too, and the agents stand above the worker."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WorkerSampling(BaseModel):
    """Default sampling of the rollout worker (a PromptTask's `sampling` overrides each field)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(default=256, ge=1, description="Tokens generated per sample at most.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature (0: greedy).")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus mass (1: off).")
    top_k: int = Field(default=-1, ge=-1, description="Top-k (-1: off).")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, description="Min-p filter (0: off); not overridable per task.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    stop_token_ids: list[int] = Field(default_factory=list, description="Stop token ids.")
    ignore_eos: bool = Field(default=False, description="Keep generating past the end-of-sequence token.")
