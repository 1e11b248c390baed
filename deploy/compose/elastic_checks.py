"""What ``make compose-test`` checks after scaling the rollout pool 1 -> 3 -> 1 mid-run, as pure functions over
what the stack leaves behind (unit-tested in tests/deploy/compose/test_elastic_checks.py without podman):

- :func:`grace_seconds`: a compose duration (``stop_grace_period: 60s``) in seconds;
- :func:`drained_line`: the counts a rollout replica logs when it drained (SIGTERM or ``POST /drain``);
- :func:`trained_positions`: from the learner's ``metrics.jsonl`` (with ``observability.log_sample_ids``), each
  dataset position's groups and samples: a position trained twice or a group trained short is a defect.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local.drill_accounting import committed_samples, position_of
from services.learner.observability import read_history
from services.learner.run_state import COUNTERS

# learner counters of work done again or thrown away: the steps at which they rose, to set against the scale's
WATCHED = ("experiences_dropped_stale", "experiences_deduplicated", "prompts_reissued", "prompts_abandoned")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# services/rollout/worker/loop.py RolloutWorker.drain's log line
_DRAINED = re.compile(r"rollout worker (\S+) drained: (\d+) group\(s\) held, (\d+) finished, (\d+) handed back, "
                      r"([0-9.]+)s")


def grace_seconds(value: str | float | None, default: float = 10.0) -> float:
    """A compose duration in seconds: ``60s``, ``1m30s``, ``500ms``, or a bare number of seconds. None: compose's
    default (10 s)."""
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value!r} is not a compose duration (e.g. 60s, 1m30s)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


@dataclass(frozen=True)
class Drained:
    consumer: str
    held: int
    finished: int
    handed_back: int
    seconds: float


def drained_line(log: str) -> Drained | None:
    """The last drain a replica's log reports, or None when it never drained."""
    found = _DRAINED.findall(log)
    if not found:
        return None
    consumer, held, finished, back, secs = found[-1]
    return Drained(consumer, int(held), int(finished), int(back), float(secs))


@dataclass
class Trained:
    steps: int
    groups: int
    samples: int
    twice: list[str] = field(default_factory=list)       # positions with two groups, or a sample id twice
    short: list[str] = field(default_factory=list)       # positions trained with fewer samples than a group
    counters: dict = field(default_factory=dict)         # the learner's counters at its last step
    rose_at: dict = field(default_factory=dict)          # counter -> the steps at which it rose (WATCHED)

    @property
    def ok(self) -> bool:
        return not self.twice and not self.short


def trained_positions(metrics_jsonl: Path, group_size: int) -> Trained:
    """Each dataset position's groups in the learner's committed history (a replayed step counts once)."""
    samples = committed_samples(metrics_jsonl)
    if not samples:
        raise ValueError(f"{metrics_jsonl} holds no sample ids (observability.log_sample_ids off?)")
    per_sample = Counter(samples)
    groups: dict[str, set[str]] = {}
    for sid in samples:
        groups.setdefault(position_of(sid), set()).add(sid.split("#")[0])
    per_position = Counter(position_of(s) for s in samples)
    twice = {p for p, g in groups.items() if len(g) > 1} | {position_of(s) for s, n in per_sample.items() if n > 1}
    short = {p for p, n in per_position.items() if p not in twice and n != group_size}
    history = read_history(metrics_jsonl)
    rose_at: dict[str, list[int]] = {}
    for name in WATCHED:
        prev = 0
        for step in sorted(history):
            value = int(history[step].get(name, prev) or 0)
            if value > prev:
                rose_at.setdefault(name, []).append(step)
            prev = value
    return Trained(steps=len(history), groups=sum(len(g) for g in groups.values()), samples=len(samples),
                   twice=sorted(twice), short=sorted(short),
                   counters={k: history[max(history)][k] for k in COUNTERS if k in history[max(history)]},
                   rose_at=rose_at)
