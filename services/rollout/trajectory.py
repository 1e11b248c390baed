"""Trajectories: what a rollout function returns, one per sample, and what a session's calls are stitched into
(pure records, no I/O).

A trajectory is one token sequence: the prompt ids, then every turn after it in order — the model's turns
exactly as the engine sampled them, and the environment's turns (tool results, user replies, the template's
turn endings and headers) exactly as the chat template wrote them. ``action_mask`` marks the model's tokens
(1) and the environment's (0); ``version_spans`` say which weight version sampled each model turn. A
single-turn sample is the one-turn case: one model turn, mask all ones.

:class:`TrajectoryBuilder` assembles one turn by turn (append only). Both producers of experiences make them:
a rollout function returns them to the worker, and a session stitches its calls into them
(``sessions/trajectory.py``); :func:`services.rollout.experiences.experiences` writes the records of both.
Rollout functions import them from ``services.rollout.worker.trajectory``, the contract's path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.schemas import FinishReason, SamplingRecord

TurnKind = Literal["model", "environment"]


@dataclass(frozen=True)
class Turn:
    """One turn of a trajectory: where its ids start in the response, and whose they are."""

    kind: TurnKind
    start: int
    ids: tuple[int, ...]
    weight_version: int | None = None  # model turns only


@dataclass(frozen=True)
class Trajectory:
    """One sample of a group: prompt, turns, mask, logprobs, versions, finish reason, reward."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    action_mask: tuple[int, ...]
    version_spans: tuple[tuple[int, int], ...]
    finish_reason: FinishReason
    reward: float
    sampling: SamplingRecord
    reward_components: dict[str, float] = field(default_factory=dict)
    prompt_text: str | None = None
    response_text: str | None = None
    turns: tuple[Turn, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)  # merged into the experience's metadata

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_logprobs) != n or len(self.action_mask) != n:
            raise ValueError(f"a trajectory's logprobs ({len(self.response_logprobs)}) and mask "
                             f"({len(self.action_mask)}) must align with its {n} response ids")
        if not math.isfinite(self.reward):
            raise ValueError(f"a trajectory's reward must be a finite number, got {self.reward!r}")

    @property
    def weight_version(self) -> int:
        return min((v for _, v in self.version_spans), default=0)

    @property
    def single_turn(self) -> bool:
        return all(self.action_mask)

    def masked(self) -> Trajectory:
        """The same trajectory with nothing trained on (every mask entry 0)."""
        from dataclasses import replace

        return replace(self, action_mask=(0,) * len(self.action_mask))


class TrajectoryBuilder:
    """Append-only assembly of one trajectory's ids, mask, logprobs and version spans."""

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        if not prompt_ids:
            raise ValueError("a trajectory needs at least one prompt token")
        self.prompt_ids = tuple(map(int, prompt_ids))
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.spans: list[tuple[int, int]] = []
        self.turns: list[Turn] = []

    @property
    def context(self) -> list[int]:
        """Everything so far: what the next model turn continues from."""
        return [*self.prompt_ids, *self.ids]

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.ids)

    @property
    def model_turns(self) -> int:
        return sum(1 for t in self.turns if t.kind == "model")

    def model(self, ids: Sequence[int], logprobs: Sequence[float], weight_version: int,
              version_spans: Sequence[tuple[int, int]] | None = None) -> None:
        """A model turn: the engine's output ids and their logprobs, as sampled. ``version_spans`` (the engine's
        ``SequenceOutput.version_spans``, positions within this turn) when the weights changed during the turn
        (partial rollouts); else ``weight_version`` produced every token."""
        if len(ids) != len(logprobs):
            raise ValueError(f"a model turn has {len(ids)} ids but {len(logprobs)} logprobs")
        start = len(self.ids)
        for offset, version in (version_spans or [(0, weight_version)]):
            self._open_span(start + int(offset), int(version))
        self._add("model", ids, list(map(float, logprobs)), 1, weight_version)

    def _open_span(self, position: int, version: int) -> None:
        if self.spans and self.spans[-1][1] == version:
            return
        if self.spans and self.spans[-1][0] == position:  # the previous span is still empty: replace it
            self.spans.pop()
            if self.spans and self.spans[-1][1] == version:
                return
        self.spans.append((position, version))

    def environment(self, ids: Sequence[int]) -> None:
        """An environment turn: template ids the model did not sample (mask 0, logprob 0.0 placeholders)."""
        if not self.spans:
            raise ValueError("an environment turn cannot come before the first model turn")
        self._add("environment", ids, [0.0] * len(ids), 0, None)

    def _add(self, kind: TurnKind, ids: Sequence[int], logprobs: list[float], mask: int, version: int | None) -> None:
        ids = tuple(map(int, ids))
        self.turns.append(Turn(kind, len(self.ids), ids, version))
        self.ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.mask.extend([mask] * len(ids))

    def build(self, *, finish_reason: FinishReason, reward: float, sampling: SamplingRecord,
              reward_components: dict[str, float] | None = None, prompt_text: str | None = None,
              response_text: str | None = None, metadata: dict[str, Any] | None = None) -> Trajectory:
        spans = list(self.spans) or [(0, 0)]
        while len(spans) > 1 and spans[-1][0] >= len(self.ids):  # an empty last model turn opens no span
            spans.pop()
        return Trajectory(
            prompt_ids=self.prompt_ids, response_ids=tuple(self.ids), response_logprobs=tuple(self.logprobs),
            action_mask=tuple(self.mask), version_spans=tuple(spans), finish_reason=finish_reason,
            reward=float(reward), sampling=sampling, reward_components=dict(reward_components or {}),
            prompt_text=prompt_text, response_text=response_text, turns=tuple(self.turns),
            metadata=dict(metadata or {}),
        )
