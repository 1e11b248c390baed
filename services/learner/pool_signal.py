"""The demand signal for an elastic rollout pool: how many rollout replicas the run should have, every step.

Pure logic (no Redis, no torch): :class:`PoolWindow` keeps the last ``window_steps`` steps' wall time, wait
time and trained tokens; :func:`pool_signal` turns them, with what the queue and the weight registry say now,
into a :class:`PoolSignal`. The learner publishes it every step (``rl_runner``): the Prometheus gauges
``fleetrl_learner_pool_*``, ``/status``'s ``pool``, and the Redis key ``shared.keys.pool_signal(run)`` (JSON,
read by ``fleetrl run``'s controller, a KEDA / HPA metric, the Ray launcher).

The formula (``R`` live replicas, ``w`` the learner's wait share over the window = time it waited for
experiences / its wall time, ``q`` prompts waiting in the stream for any replica):

- tokens per second per replica ``p = tokens trained / wall time / R`` (what the pool delivered, per replica);
- tokens per second the learner can take ``D = tokens trained / (wall time - wait time)`` (its own speed);
- **up**, ``w >= wait_high``: the learner is starved, so the pool delivers ``R p < D``. Replicas add throughput
  roughly linearly (each takes its own prompts), so supply meets demand at ``D / p = R / (1 - w)`` replicas:
  ``desired = ceil(D / p)``, at least ``R + 1`` (``w`` is capped at ``max_wait_share`` so one window can ask at
  most ``R / (1 - max_wait_share)``);
- **down**, ``w <= wait_low`` and ``q == 0``: the learner never waited and no prompt waits for a replica, so the
  pool has room; by how much the learner cannot see (a pool that is too big looks the same as one that is just
  big enough: it is held back by backpressure and the staleness bound), so it asks for one replica fewer:
  ``desired = R - 1``. If that was one too few, the wait share rises past ``wait_high`` and the up rule brings
  it back; the band between ``wait_low`` and ``wait_high`` is the hysteresis and the controller's cooldowns
  pace the steps;
- otherwise ``desired = R``; with no live replica at all, ``desired = max(1, ...)``.

The window holds only steps measured at the current pool size: a step in which the number of live replicas
changed empties it (what ``R`` old replicas delivered says nothing about ``R`` new ones, and a mixed window made
one join look like a reason for the next), and until it holds ``min_steps`` steps the signal asks for ``R``
(measuring). So the run's first steps and every change are measured before the pool moves again.

``desired`` is finally clamped to ``[1, max_replicas]``; a controller clamps it again to its own min / max.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PoolSignalSettings(BaseModel):
    """The learner's ``pool`` section: how it computes the elastic pool's demand signal (docs/elastic.md)."""

    model_config = ConfigDict(extra="forbid")

    window_steps: int = Field(default=8, ge=1, le=1000, description="Steps the wait share and rates are measured over.")
    min_steps: int = Field(default=3, ge=1, le=1000,
                           description="Steps measured at the current pool size before the signal asks for another "
                                       "size (a change in the live replicas starts the count again).")
    wait_high: float = Field(default=0.25, gt=0.0, lt=1.0,
                             description="Wait share at or above which the pool should grow (the learner is starved).")
    wait_low: float = Field(default=0.05, ge=0.0, lt=1.0,
                            description="Wait share at or below which (with no prompt waiting) the pool may shrink.")
    max_wait_share: float = Field(default=0.9, gt=0.0, lt=1.0,
                                  description="Cap on the wait share in the up rule: one window asks at most "
                                              "R / (1 - max_wait_share) replicas.")
    max_replicas: int = Field(default=64, ge=1, le=100_000, description="Upper bound on desired_replicas.")

    @model_validator(mode="after")
    def _band(self) -> PoolSignalSettings:
        if self.min_steps > self.window_steps:
            raise ValueError(f"pool.min_steps ({self.min_steps}) must be at most pool.window_steps "
                             f"({self.window_steps})")
        if self.wait_low >= self.wait_high:
            raise ValueError(f"pool.wait_low ({self.wait_low}) must be below pool.wait_high ({self.wait_high}): the "
                             "band between them is the hysteresis")
        return self


@dataclass(frozen=True)
class StepSample:
    wall_s: float  # since the previous step ended
    wait_s: float  # of that, waiting for experiences
    tokens: int  # response tokens trained


class PoolWindow:
    """The last ``size`` steps, all measured with the same number of live replicas."""

    def __init__(self, size: int) -> None:
        self.steps: deque[StepSample] = deque(maxlen=size)
        self.replicas: int | None = None  # live replicas the steps were measured with

    def add(self, wall_s: float, wait_s: float, tokens: int, replicas: int | None = None) -> bool:
        """Add one step; ``replicas``: live replicas when it ended. A step that ends with another number of live
        replicas than the window's empties it and is itself left out (the pool changed during it). True: added."""
        if replicas is not None and replicas != self.replicas:
            changed = self.replicas is not None
            self.steps.clear()
            self.replicas = replicas
            if changed:
                return False
        wall = max(0.0, wall_s)
        self.steps.append(StepSample(wall, min(max(0.0, wait_s), wall), max(0, tokens)))
        return True

    @property
    def wall_s(self) -> float:
        return sum(s.wall_s for s in self.steps)

    @property
    def wait_s(self) -> float:
        return sum(s.wait_s for s in self.steps)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.steps)


@dataclass(frozen=True)
class PoolSignal:
    replicas: int  # live replicas (weight registry heartbeats)
    prompts_waiting: int  # in the prompts stream, not yet taken by any replica
    groups_in_flight: int  # taken by a replica, not yet finished (pending on the prompts stream)
    wait_share: float  # learner's waiting / wall time over the window
    tokens_per_s_per_replica: float  # p
    learner_tokens_per_s: float  # D
    steps: int  # in the window
    desired_replicas: int
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def pool_signal(window: PoolWindow, *, replicas: int, prompts_waiting: int, groups_in_flight: int,
                settings: PoolSignalSettings) -> PoolSignal:
    """The signal for this step (the formula is the module's docstring)."""
    s = settings
    wall, wait, tokens = window.wall_s, window.wait_s, window.tokens
    w = wait / wall if wall > 0 else 0.0
    busy = wall - wait
    per_replica = tokens / wall / replicas if wall > 0 and replicas > 0 else 0.0
    demand = tokens / busy if busy > 0 else 0.0
    r = max(0, replicas)
    if r == 0:
        desired, why = 1, "no live replica"
    elif not window.steps:
        desired, why = r, "no step measured yet"
    elif len(window.steps) < s.min_steps:
        desired, why = r, (f"measuring: {len(window.steps)} of min_steps {s.min_steps} step(s) at {r} replica(s)")
    elif w >= s.wait_high:
        need = r / (1.0 - min(w, s.max_wait_share))  # = D / p, with w capped
        desired = max(r + 1, math.ceil(need - 1e-9))
        why = (f"learner waited {w:.0%} of the last {len(window.steps)} steps (>= wait_high {s.wait_high:.0%}): "
               f"{r} replica(s) deliver {per_replica * r:.0f} tokens/s, the learner takes {demand:.0f}")
    elif w <= s.wait_low and prompts_waiting == 0:
        desired = r - 1
        why = (f"learner waited {w:.0%} (<= wait_low {s.wait_low:.0%}) and no prompt waits for a replica: "
               "one fewer")
    else:
        desired = r
        why = f"learner waited {w:.0%}, {prompts_waiting} prompt(s) waiting: within the band"
    desired = min(max(1, desired), s.max_replicas)
    return PoolSignal(replicas=r, prompts_waiting=max(0, prompts_waiting), groups_in_flight=max(0, groups_in_flight),
                      wait_share=round(w, 4), tokens_per_s_per_replica=round(per_replica, 3),
                      learner_tokens_per_s=round(demand, 3), steps=len(window.steps), desired_replicas=desired,
                      reason=why)
