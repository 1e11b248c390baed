"""The run owner's durable state, saved in every checkpoint as ``run_state.json``.

The live :class:`RunState` is what the run's parts keep between checkpoints, each through the narrow part it owns
(the prompt feeder its dataset cursor and ``in_flight``, the publish rounds ``weight_version``, the dead-letter
handler its cursors, :class:`~services.learner.counters.Counters` the counts). The ids a checkpoint covers are not
part of it: the RL run's ``Commits`` owns them and writes them into the checkpoint's file (``CommitIds``, the
``commit_sample_ids``/``commit_entry_ids`` fields of the JSON, unchanged since the first format).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

COUNTERS = (
    "experiences_consumed",  # deliveries taken from the experiences stream (duplicates included)
    "experiences_deduplicated",  # dropped: sample already trained, already held, or its prompt is finished
    "experiences_dropped_stale",  # dropped: weight_version < current - max_staleness
    "experiences_rejected",  # dropped: token ids outside the vocabulary or longer than the model's context
    "experiences_unissued",  # dropped: group, size or position not what this learner issued (no or a wrong grant)
    "experiences_unsigned",  # dead-lettered: no valid run-key signature (written by something outside the fleet)
    "prompts_issued",  # PromptTasks produced (re-issues included)
    "prompts_reissued",  # after a stale drop, a timeout, a dead letter, or a prompt Redis lost in a crash
    "prompts_abandoned",  # positions given up: rollout.dead_letter_retries dead letters or rollout.max_attempts spent
    "redis_outages",  # times the learner waited for Redis to answer again
    "publishes_failed",  # weight publishes that failed (the next step publishes again)
    "groups_trained",
    "samples_trained",
    "groups_filtered",  # dropped by dynamic sampling: every reward of the group equal (their position is done)
    "dynamic_sampling_cap_reached",  # zero-variance groups trained because a step's refills were used up
)


@dataclass
class InFlight:
    """A dataset position whose prompt group has been produced but not yet trained on."""

    epoch: int
    index: int
    attempt: int
    issued_at: float
    entry: str = ""  # prompt stream entry id of the current attempt (tells a prompt Redis lost in a crash)
    group_size: int = 0  # samples issued per attempt (0: written before it was recorded; the settings' then)
    dead_letters: int = 0  # times this position's prompt or experiences were dead-lettered
    stale_drops: int = 0  # times this position's group was dropped stale (and the prompt re-issued)


@dataclass
class RunState:
    epoch: int = 0  # dataset position of the next prompt to issue
    next_index: int = 0
    in_flight: dict[str, InFlight] = field(default_factory=dict)  # item key "e{epoch}-{index}" -> InFlight
    weight_version: int = 0  # latest version this learner published
    dead_letter_cursors: dict[str, str] = field(default_factory=dict)  # DeadLetterWatch position per stream
    abandoned: dict[str, str] = field(default_factory=dict)  # item key -> why it was given up (dead letters)
    counters: dict[str, int] = field(default_factory=lambda: {k: 0 for k in COUNTERS})
    # the learner's own key for the grants of the prompt tasks it issues (never leaves the learner but in grants);
    # saved with the run so that prompts re-issued after a resume carry the grants their experiences will bear
    grant_key: str = field(default_factory=lambda: secrets.token_hex(32))

    def to_json(self, commit: CommitIds | None = None) -> str:
        """The checkpoint's ``run_state.json``, with the ids ``commit`` it covers (settled after it is written)."""
        commit = commit or CommitIds()
        return json.dumps({**asdict(self), "commit_sample_ids": list(commit.sample_ids),
                           "commit_entry_ids": list(commit.entry_ids)})

    @classmethod
    def from_json(cls, text: str) -> RunState:
        return cls.parse(text)[0]

    @classmethod
    def parse(cls, text: str) -> tuple[RunState, CommitIds]:
        """The state and the commit a checkpoint's ``run_state.json`` recorded (settled again at a resume)."""
        raw = json.loads(text)
        commit = CommitIds(tuple(raw.pop("commit_sample_ids", ())), tuple(raw.pop("commit_entry_ids", ())))
        raw["in_flight"] = {k: InFlight(**v) for k, v in raw.get("in_flight", {}).items()}
        counters = {k: 0 for k in COUNTERS}
        counters.update(raw.get("counters", {}))
        raw["counters"] = counters
        return cls(**raw), commit

    def save(self, path: Path) -> None:
        path.write_text(self.to_json())

    @classmethod
    def load(cls, path: Path) -> RunState:
        return cls.from_json(path.read_text())

    @classmethod
    def load_with_commit(cls, path: Path) -> tuple[RunState, CommitIds]:
        return cls.parse(path.read_text())


@dataclass(frozen=True)
class CommitIds:
    """What one checkpoint covers: sample ids trained (marked processed after it is written) and stream entries
    trained or dropped (acknowledged after it is written)."""

    sample_ids: tuple[str, ...] = ()
    entry_ids: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.sample_ids or self.entry_ids)

    def __add__(self, later: CommitIds) -> CommitIds:
        return CommitIds(self.sample_ids + later.sample_ids, self.entry_ids + later.entry_ids)
