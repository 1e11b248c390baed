"""Trajectories -> experiences -> the run's experiences stream: the one path of the rollout service's two producers.

The worker (a prompt task's group: one trajectory per sample, from its rollout function) and a session's finish
(its calls stitched into trajectories by ``sessions/trajectory.py``: one sample of a group, several trajectories
when the agent rewrote its history) both write their records with :func:`experiences` and push them with
:class:`ExperienceStream`. What differs between them is said by the :class:`Origin` each passes, not by code of
their own.

The push raises what goes wrong as it is (:class:`~shared.experience_queue.BackpressureTimeout`, Redis errors):
each producer keeps its own policy. The worker waits out a full backlog and a Redis outage (a generated group
is worth waiting for, and its prompts are acknowledged only once it is pushed); a session's finish answers 503
naming what to retry, and the session stays open.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from services.rollout.trajectory import Trajectory
from shared import keys
from shared.experience_queue import StreamQueue
from shared.schemas import Experience, PromptTask, sample_id
from shared.signing import RecordSigner


@dataclass(frozen=True)
class Origin:
    """Where a producer's trajectories go (their group and slots) and what each record carries of its task."""

    prompt_id: str
    group_id: str
    group_size: int
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)  # a trajectory's own metadata is merged over it
    created_at: float = field(default_factory=time.time)
    grant: str | None = None  # the learner's grant of the task (PromptTask.grant), copied into each record
    #: None: trajectory ``i`` is sample ``i`` of the group (a worker's group: ids ``<prompt id>#<i>``). A slot
    #: ``k``: every trajectory is sample ``k`` (a session: ids ``<prompt id>#<k>``, then ``~1``, ``~2`` ... for
    #: the trajectories a rewritten history started)
    index: int | None = None
    #: how a record writes the trivial mask and spans, as each producer always has: a worker's leaves out an
    #: all-model ``action_mask`` (None) and always gives ``version_spans``; a session's always gives its mask and
    #: gives spans only when the weights changed within the trajectory
    mask_always: bool = False
    spans_when_mixed: bool = False

    @classmethod
    def of_task(cls, task: PromptTask) -> Origin:
        """A prompt task's group, as the worker fills it."""
        return cls(prompt_id=task.id, group_id=task.id, group_size=task.n, label=task.label, metadata=task.metadata,
                   created_at=task.created_at, grant=task.grant)

    def slot(self, i: int) -> tuple[str, int]:
        """The id and group index of the record of trajectory ``i``."""
        if self.index is None:
            return sample_id(self.prompt_id, i), i
        base = sample_id(self.prompt_id, self.index)
        return (base if i == 0 else f"{base}~{i}"), self.index


def experiences(origin: Origin | PromptTask, trajectories: Sequence[Trajectory]) -> list[Experience]:
    """One experience per trajectory, in order (a prompt task stands for :meth:`Origin.of_task`). ``action_mask``
    is left out (None) when every response token is the model's, as single-turn samples always are, unless
    ``origin.mask_always``; ``version_spans`` are left out when one weight version made every token only with
    ``origin.spans_when_mixed``."""
    o = Origin.of_task(origin) if isinstance(origin, PromptTask) else origin
    now = time.time()
    group = []
    for i, t in enumerate(trajectories):
        rid, index = o.slot(i)
        spans = [(s[0], s[1]) for s in t.version_spans]
        group.append(Experience(
            id=rid, prompt_id=o.prompt_id, group_id=o.group_id, group_size=o.group_size, index=index,
            prompt_token_ids=list(t.prompt_ids), response_token_ids=list(t.response_ids),
            response_logprobs=list(t.response_logprobs), finish_reason=t.finish_reason, reward=t.reward,
            reward_components=dict(t.reward_components), weight_version=t.weight_version,
            prompt_text=t.prompt_text, response_text=t.response_text, label=o.label,
            metadata={**o.metadata, **t.metadata}, created_at=o.created_at, generated_at=now,
            action_mask=list(t.action_mask) if o.mask_always or not all(t.action_mask) else None,
            version_spans=None if o.spans_when_mixed and len({v for _, v in spans}) == 1 else spans,
            sampling=t.sampling, grant=o.grant,
        ))
    return group


class ExperienceStream:
    """The experiences stream of run ``run`` (``shared.keys.experiences_stream``), as producers write it: read by
    the learner's consumer group, bounded by the run's ``max_experience_backlog``, signed as the fleet's."""

    def __init__(self, redis: aioredis.Redis, run: str, *, max_backlog: int, signer: RecordSigner | None = None) -> None:
        self.queue: StreamQueue[Experience] = StreamQueue(redis, keys.experiences_stream(run), "learner", Experience,
                                                          max_backlog=max_backlog, signer=signer)

    @property
    def stream(self) -> str:
        return self.queue.stream

    async def backlog(self) -> int:
        """Experiences pushed and not yet taken by the learner."""
        return await self.queue.backlog()

    async def push(self, group: list[Experience], timeout: float) -> None:
        """Append ``group`` (the stream and the learner's consumer group are created the first time), waiting up
        to ``timeout`` seconds while the backlog is full (then :class:`BackpressureTimeout`)."""
        await self.queue.ensure_group()
        await self.queue.produce(group, timeout=timeout)
