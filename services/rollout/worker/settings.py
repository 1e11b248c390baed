"""What the worker is given of the service's settings: :class:`WorkerRun` (the run it works for and its own
section) and, of that section, what the loop reads (:class:`WorkerSection`); and the worker's default sampling
(``worker.sampling``).

The ``worker`` section itself (``WorkerSettings``) is put together in ``services/rollout/settings.py``: it holds
the agents' sections too, and the agents stand above the worker, so the worker names what it reads here instead of
importing it. The section goes whole to the rollout functions (``RolloutContext.settings``: ``agent``,
``program``, ``function_settings`` are theirs). ``tests/rollout/worker/test_worker_settings.py`` checks that the
loop reads nothing beyond these and that ``WorkerSettings`` has each member with the same type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from shared.run_settings import RunSettings


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


@runtime_checkable
class WorkerSection(Protocol):
    """What the worker loop reads of the ``worker`` section (each is a ``WorkerSettings`` field of that type; its
    description is there)."""

    @property
    def consumer_name(self) -> str | None: ...
    @property
    def rollout_function(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def prompts_max_deliveries(self) -> int: ...
    @property
    def poll_interval_s(self) -> float: ...
    @property
    def drain_timeout_s(self) -> float: ...
    @property
    def reward_url(self) -> str | None: ...
    @property
    def reward_token(self) -> SecretStr | None: ...
    @property
    def reward_timeout_s(self) -> float: ...
    @property
    def reward_backoff_max_s(self) -> float: ...
    @property
    def reward_max_attempts(self) -> int: ...
    @property
    def reward_max_retry_s(self) -> float: ...
    @property
    def reward_batch_ms(self) -> float: ...
    @property
    def sampling(self) -> WorkerSampling: ...


@dataclass(frozen=True)
class WorkerRun:
    """The worker's settings: where the run's streams are and how its records are signed, and the worker
    section; nothing else of the service's settings (the service builds it from its ``RolloutSettings``)."""

    redis_url: str | None  # the run's Redis (the worker refuses to start without one)
    run_name: str  # namespace of the run's Redis keys
    run_key: SecretStr | None  # signs experiences, checks prompts (None: allow_unsigned_records)
    worker: WorkerSection
    run: RunSettings = field(default_factory=RunSettings)  # the run-wide bounds: staleness, claim time, backlog
