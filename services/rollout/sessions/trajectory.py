"""A session's calls stitched into trajectories, and trajectories into experiences (pure: no I/O).

A call whose prompt ids start with everything the current trajectory holds (its prompt, then every token
after it) continues that trajectory: the ids between the trajectory's end and the call's prompt end are
the environment's (a tool result, the next user turn, the chat template's glue: mask 0, logprob 0); the
call's output ids are the model's (mask 1, the engine's logprobs). A call whose prompt does not extend it
(the agent rewrote or summarised its history) starts a new trajectory: the session then yields one
experience per trajectory, all in the session's group slot (ids ``<sample id>``, ``<sample id>~1``, ...).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from services.rollout.engines.types import SamplingParams
from shared.schemas import Experience, FinishReason, SamplingRecord, sample_id


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


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)  # (first response token, version) per model turn
    turns: int = 0
    finish: FinishReason = "stop"
    params: SamplingParams | None = None
    max_tokens: int = 1

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def extended_by(self, prompt_ids: list[int]) -> bool:
        """Whether ``prompt_ids`` starts with every id of this trajectory."""
        n = len(self.prompt_ids)
        return (len(prompt_ids) >= self.length and prompt_ids[:n] == self.prompt_ids
                and prompt_ids[n:self.length] == self.response_ids)

    def add(self, call: Call) -> None:
        env = call.prompt_ids[self.length:]
        self.response_ids += env
        self.logprobs += [0.0] * len(env)
        self.mask += [0] * len(env)
        self.spans.append((len(self.response_ids), call.weight_version))
        self.response_ids += call.output_ids
        self.logprobs += call.logprobs
        self.mask += [1] * len(call.output_ids)
        self.turns += 1
        self.finish = call.finish
        self.params = self.params or call.params
        self.max_tokens = max(self.max_tokens, call.params.max_new_tokens)


class SamplingMismatch(ValueError):
    """A call samples from another distribution than the trajectory it continues."""


def check_extension(trajectories: list[Trajectory], prompt_ids: list[int], params: SamplingParams) -> bool:
    """Whether a call with ``prompt_ids`` extends the last trajectory; :class:`SamplingMismatch` if it would
    extend it with another sampling distribution."""
    last = trajectories[-1] if trajectories else None
    if last is None or not last.extended_by(prompt_ids):
        return False
    assert last.params is not None
    if sampling_key(last.params) != sampling_key(params):
        t, p, k, m = sampling_key(last.params)
        raise SamplingMismatch(
            f"this call continues a trajectory sampled with temperature={t}, top_p={p}, top_k={k}, min_p={m}; "
            "one trajectory is sampled from one distribution (the learner scores it that way): keep these "
            "the same for every call of a session")
    return True


def append(trajectories: list[Trajectory], call: Call) -> bool:
    """Add ``call`` to the last trajectory when its prompt extends it, else start a new one. Returns whether it
    extended the last trajectory. Raises :class:`SamplingMismatch` if it extends one sampled differently."""
    if check_extension(trajectories, call.prompt_ids, call.params):
        trajectories[-1].add(call)
        return True
    t = Trajectory(prompt_ids=list(call.prompt_ids))
    t.add(call)
    trajectories.append(t)
    return False


def version_spans(t: Trajectory) -> tuple[int, list[tuple[int, int]] | None]:
    """(the oldest weight version of the model's tokens, version spans; None when one version made them all)."""
    spans: list[tuple[int, int]] = []
    for i, (start, v) in enumerate(t.spans):
        start = 0 if i == 0 else start
        if i and start >= len(t.response_ids):
            continue  # a last turn that produced no token
        if spans and spans[-1][0] == start:
            spans[-1] = (start, v)  # the turn before it produced no token
        elif not spans or spans[-1][1] != v:
            spans.append((start, v))
    versions = [v for _, v in spans]
    if len(set(versions)) == 1:
        return versions[0], None
    return min(versions), spans


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


def experience_id(who: SessionIdentity, k: int) -> str:
    base = sample_id(who.prompt_id, who.index)
    return base if k == 0 else f"{base}~{k}"


def experiences(who: SessionIdentity, trajectories: list[Trajectory], rewards: list[float],
                components: list[dict[str, float]], texts: list[tuple[str, str]]) -> list[Experience]:
    """One experience per trajectory: ``rewards[k]`` / ``components[k]`` / ``texts[k]`` (prompt, response) are
    trajectory ``k``'s."""
    now = time.time()
    out = []
    for k, (t, reward, comps, (prompt_text, response_text)) in enumerate(zip(trajectories, rewards, components, texts)):
        version, spans = version_spans(t)
        out.append(Experience(
            id=experience_id(who, k), prompt_id=who.prompt_id, group_id=who.group_id, group_size=who.group_size,
            index=who.index, prompt_token_ids=t.prompt_ids, response_token_ids=t.response_ids,
            response_logprobs=t.logprobs, finish_reason=t.finish, reward=float(reward), reward_components=comps,
            weight_version=version, prompt_text=prompt_text, response_text=response_text, label=who.label,
            metadata={**who.metadata, "session_id": who.session_id, "turns": t.turns, "trajectory": k,
                      "trajectories": len(trajectories)},
            created_at=who.created_at, generated_at=now, action_mask=t.mask, version_spans=spans,
            sampling=sampling_of(t), grant=who.grant,
        ))
    return out


def sampling_of(t: Trajectory) -> SamplingRecord:
    """How the trajectory's model turns were sampled (one distribution for all: :func:`check_extension`)."""
    p = t.params
    assert p is not None
    return SamplingRecord(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else -1,
                          min_p=p.min_p, max_tokens=max(1, t.max_tokens))
