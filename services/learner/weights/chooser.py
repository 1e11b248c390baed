"""Delta or full, per round, from what the rounds took (``publish.sync.delta: auto``).

    chooser = RoundChooser("auto", probe_every=20)
    choice = chooser.choose()                       # Choice(kind="delta" | "full", reason=...), nothing changes
    chooser.record("full", seconds, version_bytes)  # after a round that every member loaded

Neither kind wins everywhere (docs/weight-sync.md, "Delta rounds"): a delta round carries a few percent of the
bytes but puts the learner's compare on the round's critical path, so it wins on a slow link and loses on a fast
one (or on loopback). The chooser keeps, per kind, an estimate of a round's time per byte of the version (model
size is fixed within a run; per byte, a change of layout does not upset it) and picks the faster kind:

- *warm-up*: a kind's first round is cold (buffers touched for the first time, the transport's first use: a full
  round of the benchmark's 100M model took 0.31 s first and 0.19-0.20 s after), so each kind runs twice before
  its estimate counts, and its second round replaces the first instead of being averaged with it: full, full
  (the first round of a publisher is full anyway), delta, delta, then the faster. (Trusting the cold first full
  round, ``auto`` kept choosing delta rounds that took 1.25-1.55x a full one on a quiet loopback:
  ``benchmarks/weight_delta.py --steps 3 --lrs 1e-6 --bucket-mb 256 --no-lora``, 2026-11-29.);
- *faster*: the kind whose estimate is lower; near a tie the kind in use stays (the other takes over only once its
  estimate is :data:`MARGIN` below: a tie costs nothing either way, and the choice and its log line do not flap);
- *probe*: the other kind, once the faster one has run ``probe_every - 1`` rounds in a row, so that a change of
  learning rate, link or replica count is noticed. A probe of a kind ``r`` times slower costs ``(r - 1) /
  probe_every`` of a round on average (at 20: 1.5 % where delta takes 1.3x a full round, 25 % where a full round
  takes 6x a delta round).

An estimate is an exponential average (:data:`EMA_WEIGHT` on the newest round) of a kind's consecutive rounds; a
kind's first round after ``probe_every - 1`` rounds of the other kind (a probe, or the first round after a switch)
replaces it instead (the old one is at least that many rounds stale), so one probe is enough to switch.

``on`` always chooses delta and ``off`` full, whatever was measured. Pure: no clock, no I/O (the collective
transport measures; tests give timings by hand).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["delta", "full"]

#: rounds between probes of the slower kind (``publish.sync.delta_probe_every`` overrides it)
PROBE_EVERY = 20
#: weight of the newest round in a kind's estimate
EMA_WEIGHT = 0.5
#: the kind not in use takes over once its estimate is this much (a fraction) below the one in use
MARGIN = 0.1
#: a kind's first rounds that are only a warm-up (replaced by the next, not averaged)
WARM_UP = 1


@dataclass(frozen=True)
class Choice:
    """One round's choice: the kind, why (``setting``, ``warm-up``, ``faster``, ``probe``), and the estimates it was
    made from (seconds a round of ``nbytes``; None: not measured yet)."""

    kind: Kind
    reason: str
    full_s: float | None = None
    delta_s: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "reason": self.reason,
                "full_s": None if self.full_s is None else round(self.full_s, 4),
                "delta_s": None if self.delta_s is None else round(self.delta_s, 4)}


@dataclass
class RoundChooser:
    """See the module docstring."""

    mode: Literal["auto", "on", "off"] = "auto"
    probe_every: int = PROBE_EVERY
    #: seconds per byte of the version, per kind (absent: never measured)
    per_byte: dict[str, float] = field(default_factory=dict)
    #: rounds recorded since each kind last ran (absent: never)
    since: dict[str, int] = field(default_factory=dict)
    #: rounds recorded of each kind (the first of each is a warm-up)
    rounds: dict[str, int] = field(default_factory=dict)
    nbytes: int = 0  # the last recorded round's version size (what the estimates are scaled to)
    faster: Kind | None = None  # the kind in use (by the estimates, with MARGIN); None until both are measured

    def __post_init__(self) -> None:
        if self.probe_every < 2:
            raise ValueError(f"probe_every must be at least 2 (got {self.probe_every})")

    def estimate(self, kind: Kind) -> float | None:
        """Seconds a round of ``kind`` is expected to take for a version of the last recorded size."""
        s = self.per_byte.get(kind)
        return None if s is None else s * self.nbytes

    def choose(self) -> Choice:
        """The kind of the next round where a delta round is possible (every member level with the base)."""
        full_s, delta_s = self.estimate("full"), self.estimate("delta")
        if self.mode != "auto":
            return Choice("delta" if self.mode == "on" else "full", "setting", full_s, delta_s)
        for kind in ("full", "delta"):  # each kind twice before its estimate counts (full first: see the docstring)
            if self.rounds.get(kind, 0) < WARM_UP + 1:
                return Choice(kind, "warm-up", full_s, delta_s)
        assert full_s is not None and delta_s is not None
        faster: Kind = self.faster or ("delta" if delta_s < full_s else "full")
        other: Kind = "full" if faster == "delta" else "delta"
        if self.since.get(other, 0) >= self.probe_every - 1:
            return Choice(other, "probe", full_s, delta_s)
        return Choice(faster, "faster", full_s, delta_s)

    def record(self, kind: Kind, seconds: float, nbytes: int) -> None:
        """A round of ``kind`` that every member loaded took ``seconds`` (its version: ``nbytes`` bytes)."""
        if nbytes <= 0 or seconds < 0:
            return
        sample = seconds / nbytes
        old = self.per_byte.get(kind)
        stale = self.since.get(kind, 0) >= self.probe_every - 1 or self.rounds.get(kind, 0) <= WARM_UP
        self.per_byte[kind] = sample if old is None or stale else EMA_WEIGHT * sample + (1 - EMA_WEIGHT) * old
        self.rounds[kind] = self.rounds.get(kind, 0) + 1
        for k in list(self.since):
            self.since[k] += 1
        self.since[kind] = 0
        self.nbytes = nbytes
        full, delta = self.per_byte.get("full"), self.per_byte.get("delta")
        if full is not None and delta is not None and min(self.rounds.get("full", 0),
                                                           self.rounds.get("delta", 0)) > WARM_UP:
            if self.faster is None:
                self.faster = "delta" if delta < full else "full"
            elif self.faster == "full" and delta < (1 - MARGIN) * full:
                self.faster = "delta"
            elif self.faster == "delta" and full < (1 - MARGIN) * delta:
                self.faster = "full"
