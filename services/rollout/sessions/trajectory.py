"""A session's calls stitched into trajectories, the worker's kind (pure: no I/O).

A call whose prompt ids start with everything the current trajectory holds (its prompt, then every token
after it) continues that trajectory: the ids between the trajectory's end and the call's prompt end are
the environment's (a tool result, the next user turn, the chat template's glue: mask 0, logprob 0); the
call's output ids are the model's (mask 1, the engine's logprobs). A call whose prompt does not extend it
(the agent rewrote or summarised its history) starts a new trajectory: the session then yields one
experience per trajectory, all in the session's group slot (ids ``<sample id>``, ``<sample id>~1``, ...).

Each trajectory is recorded with :class:`~services.rollout.trajectory.TrajectoryBuilder` and finished as a
:class:`~services.rollout.trajectory.Trajectory`, the kind a rollout function returns to the worker; the records
are written by :func:`services.rollout.experiences.experiences`, the one path of both producers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.rollout.engines.types import SamplingParams
from services.rollout.experiences import Origin
from services.rollout.experiences import experiences as records
from services.rollout.trajectory import Trajectory, TrajectoryBuilder
from shared.schemas import Experience, FinishReason, SamplingRecord


@dataclass(frozen=True)
class Call:
    """One generation call of a session, as the engine ran it."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish: FinishReason
    weight_version: int
    params: SamplingParams


def sampling_key(p: SamplingParams) -> tuple[float, float, int, float]:
    """What must stay the same across the model turns of one trajectory (the distribution sampled from)."""
    return (p.temperature, p.top_p, p.top_k if p.top_k > 0 else -1, p.min_p)


class Recording:
    """One trajectory of a session, recorded call by call (append only); :meth:`build` finishes it."""

    def __init__(self, call: Call) -> None:
        self.builder = TrajectoryBuilder(call.prompt_ids)
        self.params = call.params  # every call of it samples from this distribution (check_extension)
        self.max_tokens = 1
        self.finish: FinishReason = "stop"
        self.add(call)

    @property
    def length(self) -> int:
        return len(self.builder)

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.builder.prompt_ids)

    @property
    def response_ids(self) -> list[int]:
        return self.builder.ids

    @property
    def logprobs(self) -> list[float]:
        return self.builder.logprobs

    @property
    def mask(self) -> list[int]:
        return self.builder.mask

    @property
    def turns(self) -> int:
        """The calls it holds (the model's turns)."""
        return self.builder.model_turns

    def extended_by(self, prompt_ids: Sequence[int]) -> bool:
        """Whether ``prompt_ids`` starts with every id of this trajectory."""
        b = self.builder
        n = len(b.prompt_ids)
        return (len(prompt_ids) >= len(b) and tuple(prompt_ids[:n]) == b.prompt_ids
                and list(prompt_ids[n:len(b)]) == b.ids)

    def add(self, call: Call) -> None:
        env = call.prompt_ids[self.length:]
        if env:
            self.builder.environment(env)
        self.builder.model(call.output_ids, call.logprobs, call.weight_version)
        self.finish = call.finish
        self.max_tokens = max(self.max_tokens, call.params.max_new_tokens)

    def last_model_turn(self) -> list[int]:
        """The ids of its last call's output (what a reward service judges of an agent's answer)."""
        last = next((t for t in reversed(self.builder.turns) if t.kind == "model"), None)
        return list(last.ids) if last is not None else []

    def sampling(self) -> SamplingRecord:
        """How its model turns were sampled (one distribution for all: :func:`check_extension`)."""
        p = self.params
        return SamplingRecord(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else -1,
                              min_p=p.min_p, max_tokens=max(1, self.max_tokens))

    def build(self, reward: float, components: dict[str, float], prompt_text: str | None = None,
              response_text: str | None = None, metadata: dict[str, Any] | None = None) -> Trajectory:
        """The finished trajectory, as a rollout function returns one."""
        return self.builder.build(finish_reason=self.finish, reward=reward, sampling=self.sampling(),
                                  reward_components=components, prompt_text=prompt_text,
                                  response_text=response_text, metadata=metadata)


class SamplingMismatch(ValueError):
    """A call samples from another distribution than the trajectory it continues."""


def check_extension(trajectories: list[Recording], prompt_ids: list[int], params: SamplingParams) -> bool:
    """Whether a call with ``prompt_ids`` extends the last trajectory; :class:`SamplingMismatch` if it would
    extend it with another sampling distribution."""
    last = trajectories[-1] if trajectories else None
    if last is None or not last.extended_by(prompt_ids):
        return False
    if sampling_key(last.params) != sampling_key(params):
        t, p, k, m = sampling_key(last.params)
        raise SamplingMismatch(
            f"this call continues a trajectory sampled with temperature={t}, top_p={p}, top_k={k}, min_p={m}; "
            "one trajectory is sampled from one distribution (the learner scores it that way): keep these "
            "the same for every call of a session")
    return True


def append(trajectories: list[Recording], call: Call) -> bool:
    """Add ``call`` to the last trajectory when its prompt extends it, else start a new one. Returns whether it
    extended the last trajectory. Raises :class:`SamplingMismatch` if it extends one sampled differently."""
    if check_extension(trajectories, call.prompt_ids, call.params):
        trajectories[-1].add(call)
        return True
    trajectories.append(Recording(call))
    return False


@dataclass(frozen=True)
class SessionIdentity:
    """Where a session's experiences go and which group slot they fill."""

    session_id: str
    prompt_id: str
    group_id: str
    group_size: int
    index: int
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    grant: str | None = None  # the learner's grant of the task (PromptTask.grant), copied into each experience

    def origin(self) -> Origin:
        """Where its experiences go: its slot of the group, every trajectory's record there."""
        return Origin(prompt_id=self.prompt_id, group_id=self.group_id, group_size=self.group_size, label=self.label,
                      metadata={**self.metadata, "session_id": self.session_id}, created_at=self.created_at,
                      grant=self.grant, index=self.index, mask_always=True, spans_when_mixed=True)


def trajectories(recorded: list[Recording], rewards: list[float], components: list[dict[str, float]],
                 texts: list[tuple[str, str]]) -> list[Trajectory]:
    """A finished session's trajectories: ``rewards[k]`` / ``components[k]`` / ``texts[k]`` (prompt, response) are
    trajectory ``k``'s; each says its calls (``turns``) and which of how many it is."""
    n = len(recorded)
    return [r.build(float(reward), comps, prompt_text, response_text,
                    {"turns": r.turns, "trajectory": k, "trajectories": n})
            for k, (r, reward, comps, (prompt_text, response_text)) in enumerate(zip(recorded, rewards, components, texts))]


def experiences(who: SessionIdentity, recorded: list[Recording], rewards: list[float],
                components: list[dict[str, float]], texts: list[tuple[str, str]]) -> list[Experience]:
    """One experience per trajectory, in the session's group slot (see :func:`trajectories`)."""
    return records(who.origin(), trajectories(recorded, rewards, components, texts))
