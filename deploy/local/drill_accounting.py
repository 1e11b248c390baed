"""Accounting of one drill run: where every prompt of the dataset went, and whether every reward is true.

Pure functions over what a finished run leaves behind (the learner's ``metrics.jsonl`` with sample ids,
its ``samples.jsonl``, its final ``run_state.json``, and the run's dead-letter entries), so they are
unit-tested without a fleet.

- **trained once**: the dataset position's group appears exactly once in the committed history (each
  step's last record: a step replayed after a learner crash counts once), with every sample once.
- **trained twice**: a sample id twice in that history, or two groups of one position.
- **dead-lettered**: a position the learner gave up with a reason (``run_state.abandoned``).
- **lost**: a position neither trained nor given up.
- **valid entries dead-lettered**: entries in the dead-letter streams. The drills feed only valid work,
  so every one of them is a defect.
- **rewards wrong**: a trained sample whose reward differs from the task's own recomputation (a reward
  invented during an outage would show here).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.learner.observability import read_history
from shared.group_id import GroupId


@dataclass
class Accounting:
    issued: int
    trained_once: int
    trained_twice: int
    dead_lettered: int
    lost: int
    valid_dead_lettered: int
    rewards_checked: int
    rewards_wrong: int
    details: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.trained_twice == 0 and self.valid_dead_lettered == 0
                and self.rewards_wrong == 0 and self.trained_once + self.dead_lettered == self.issued)


def position_of(sample_or_group_id: str) -> str:
    """Dataset position ``e{epoch}-{index}`` of a sample id (``e0-3-r1#2``) or group id (``e0-3-r1``)."""
    gid = GroupId.parse(sample_or_group_id)
    if gid is None:
        raise ValueError(f"{sample_or_group_id!r} is not a FleetRL group or sample id")
    return gid.position


def committed_samples(metrics_jsonl: Path) -> list[str]:
    """Sample ids of the committed history (each step's last metrics line)."""
    return [sid for row in read_history(metrics_jsonl).values() for sid in row.get("sample_ids", [])]


def latest_sample_lines(samples_jsonl: Path) -> dict[tuple[int, str], dict]:
    """samples.jsonl lines by (step, sample id), the last written winning (a replayed step rewrites them)."""
    out: dict[tuple[int, str], dict] = {}
    if not samples_jsonl.is_file():
        return out
    for line in samples_jsonl.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # cut by a crash
            continue
        out[(int(row["step"]), row["id"])] = row
    return out


def account(*, positions: list[str], group_size: int, metrics_jsonl: Path, samples_jsonl: Path,
            run_state: dict, dead_letters: list[dict[str, str]],
            reward_of: Callable[[str | None, object], float]) -> Accounting:
    """Where each of ``positions`` went. ``reward_of(response_text, label)`` recomputes a sample's reward."""
    trained = committed_samples(metrics_jsonl)
    per_sample = Counter(trained)
    groups_per_position: dict[str, set[str]] = {}
    for sid in trained:
        groups_per_position.setdefault(position_of(sid), set()).add(sid.split("#")[0])
    details: list[str] = []
    twice = {p for p, groups in groups_per_position.items() if len(groups) > 1}
    twice |= {position_of(s) for s, n in per_sample.items() if n > 1}
    samples_per_position = Counter(position_of(s) for s in trained)
    once = {p for p in groups_per_position if p not in twice and samples_per_position[p] == group_size}
    abandoned = dict(run_state.get("abandoned", {}))
    lost = [p for p in positions if p not in once and p not in twice and p not in abandoned]
    details += [f"trained twice: {p} {sorted(groups_per_position.get(p, []))}" for p in sorted(twice)]
    details += [f"given up: {p}: {why}" for p, why in sorted(abandoned.items())]
    details += [f"lost: {p}" for p in lost[:10]]
    details += [f"dead letter in {d.get('stream', '?')}: {d.get('error', '')}" for d in dead_letters[:10]]
    checked = wrong = 0
    lines = latest_sample_lines(samples_jsonl)
    history = read_history(metrics_jsonl)
    for step, row in history.items():
        for sid in row.get("sample_ids", []):
            sample = lines.get((step, sid))
            if sample is None:
                wrong += 1
                details.append(f"no samples.jsonl line for {sid} of step {step}")
                continue
            checked += 1
            expected = reward_of(sample.get("response_text"), sample.get("label"))
            if abs(float(sample["reward"]) - expected) > 1e-6:
                wrong += 1
                details.append(f"reward of {sid}: {sample['reward']} recorded, {expected} recomputed")
    return Accounting(issued=len(positions), trained_once=len(once), trained_twice=len(twice),
                      dead_lettered=len([p for p in positions if p in abandoned]), lost=len(lost),
                      valid_dead_lettered=len(dead_letters), rewards_checked=checked, rewards_wrong=wrong,
                      details=details)
