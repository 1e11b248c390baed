"""The demand signal for an elastic rollout pool: how many rollout replicas the run should have, every step.

Pure logic (no Redis, no torch): :class:`PoolWindow` keeps the last ``window_steps`` steps' wall time, wait
time and trained tokens; :func:`pool_signal` turns them, with what the queue and the weight registry say now,
into a :class:`PoolSignal`. The learner publishes it every step (``rl_runner``): the Prometheus gauges
``fleetrl_learner_pool_*``, ``/status``'s ``pool``, and the Redis key ``shared.keys.pool_signal(run)`` (JSON,
read by ``fleetrl run``'s controller, a KEDA / HPA metric, the Ray launcher).

The formula (``R`` live replicas, ``w`` the learner's wait share over the window = time it waited for
experiences / its wall time, ``q`` prompts waiting in the stream for any replica now, ``b`` the **backlog**: the
median over the window's steps of the prompts that waited for a replica *while the learner waited* (each step's
mean of the stream samples ``PoolWatch`` takes during the learner's waits, weighted by the wait; a step without a
wait: ``q`` at its end), ``g`` the same median of the groups held by a replica (taken, not finished)):

- tokens per second per replica ``p = tokens trained / wall time / R`` (what the pool delivered, per replica);
- tokens per second the learner can take ``D = tokens trained / (wall time - wait time)`` (its own speed);
- **up**, ``w >= wait_high`` **and** ``b >= backlog_min``: the learner is starved *and* prompts wait for a
  replica, so a replica more would take work. Replicas add throughput roughly linearly (each takes its own
  prompts), so supply meets demand at ``D / p = R / (1 - w)`` replicas; but only ``ceil(b / c)`` more replicas
  find anything to take, ``c = max(1, g / R)`` the groups a busy replica holds. So
  ``desired = max(R + 1, min(ceil(D / p), R + ceil(b / c)))`` (``w`` is capped at ``max_wait_share`` so one
  window asks at most ``R / (1 - max_wait_share)``);
- a starved learner with no backlog (``b < backlog_min``) keeps the pool: every prompt the learner has issued is
  already held by a replica, so a replica more would sit idle (the wait is the pipeline's: the staleness bound,
  the window, a publish, a slow reward), not the pool's;
- **down**, ``w <= wait_low`` and ``q == 0``: the learner never waited and no prompt waits for a replica, so the
  pool has room; by how much the learner cannot see (a pool that is too big looks the same as one that is just
  big enough: it is held back by backpressure and the staleness bound), so it asks for one replica fewer:
  ``desired = R - 1``. If that was one too few, the wait share and the backlog rise and the up rule brings
  it back; the band between ``wait_low`` and ``wait_high`` is the hysteresis and the controller's cooldowns
  pace the steps;
- otherwise ``desired = R``; with no live replica at all, ``desired = max(1, ...)``.

The window holds only steps measured at the current pool size: a step in which the number of live replicas
changed empties it (what ``R`` old replicas delivered says nothing about ``R`` new ones, and a mixed window made
one join look like a reason for the next), and until it holds ``min_steps`` steps the signal asks for ``R``
(measuring). The run's first ``warmup_steps`` steps are never measured: the pipeline is filling (the replicas
load weights and take their first prompts, the learner waits for the first groups), which says nothing about
the pool's size. So the run's start and every change are measured before the pool moves again.

``desired`` is finally clamped to ``[1, max_replicas]``; a controller clamps it again to its own min / max.
"""

from __future__ import annotations

import math
import statistics
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
    backlog_min: float = Field(default=1.0, gt=0.0, le=1_000_000,
                               description="Prompts that must wait for a replica (the median over the window) "
                                           "before the pool grows: without a backlog a replica more has nothing "
                                           "to take.")
    warmup_steps: int = Field(default=2, ge=0, le=1000,
                              description="The run's first steps, not measured (the pipeline filling).")
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
    waiting: float = 0.0  # prompts waiting in the stream for any replica while the learner waited (mean)
    in_flight: float = 0.0  # groups held by a replica then


class PoolWindow:
    """The last ``size`` steps, all measured with the same number of live replicas; the first ``warmup`` steps
    ever added are left out (the run's start)."""

    def __init__(self, size: int, warmup: int = 0) -> None:
        self.steps: deque[StepSample] = deque(maxlen=size)
        self.replicas: int | None = None  # live replicas the steps were measured with
        self.warmup = max(0, warmup)  # steps still to leave out

    def add(self, wall_s: float, wait_s: float, tokens: int, replicas: int | None = None, *, waiting: float = 0.0,
            in_flight: float = 0.0) -> bool:
        """Add one step; ``replicas``: live replicas when it ended, ``waiting`` / ``in_flight``: the prompts stream
        while the learner waited in it (``PoolWatch`` samples it). A step that ends with another number of live replicas than the window's empties it and is itself left
        out (the pool changed during it); so is one of the first ``warmup``. True: added."""
        if self.warmup > 0:
            self.warmup -= 1
            self.replicas = replicas if replicas is not None else self.replicas
            return False
        if replicas is not None and replicas != self.replicas:
            changed = self.replicas is not None
            self.steps.clear()
            self.replicas = replicas
            if changed:
                return False
        wall = max(0.0, wall_s)
        self.steps.append(StepSample(wall, min(max(0.0, wait_s), wall), max(0, tokens), max(0, waiting),
                                     max(0, in_flight)))
        return True

    @property
    def backlog(self) -> float:
        """Median of the prompts waiting for a replica at the window's steps' ends (a passing burst is no backlog)."""
        return statistics.median(s.waiting for s in self.steps) if self.steps else 0.0

    @property
    def held(self) -> float:
        """Median of the groups held by replicas at the window's steps' ends."""
        return statistics.median(s.in_flight for s in self.steps) if self.steps else 0.0

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
    backlog: float  # median prompts waiting for a replica over the window
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
    backlog = window.backlog
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
    elif w >= s.wait_high and backlog >= s.backlog_min:
        need = r / (1.0 - min(w, s.max_wait_share))  # = D / p, with w capped
        per_taker = max(1.0, window.held / r)  # groups a busy replica holds
        takers = math.ceil(backlog / per_taker - 1e-9)  # replicas more that would find a prompt to take
        desired = max(r + 1, min(math.ceil(need - 1e-9), r + takers))
        why = (f"learner waited {w:.0%} of the last {len(window.steps)} steps (>= wait_high {s.wait_high:.0%}) and "
               f"{backlog:g} prompt(s) wait for a replica (~{per_taker:g} per replica): {r} replica(s) deliver "
               f"{per_replica * r:.0f} tokens/s, the learner takes {demand:.0f}")
    elif w >= s.wait_high:
        desired = r
        why = (f"learner waited {w:.0%} of the last {len(window.steps)} steps but no prompt waits for a replica "
               f"(backlog {backlog:g} < backlog_min {s.backlog_min:g}): a replica more would have nothing to take")
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
                      learner_tokens_per_s=round(demand, 3), steps=len(window.steps), backlog=backlog,
                      desired_replicas=desired,
                      reason=why)
