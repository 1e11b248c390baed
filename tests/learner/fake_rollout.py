"""A stand-in rollout fleet for learner tests: takes PromptTasks, pushes scored Experiences to Redis.

Responses are fixed token patterns (GOOD tokens rewarded 1, BAD tokens 0), stamped with the weight
version currently in Redis, like a real fleet after it loaded the latest weights.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared import keys
from shared.experience_queue import StreamQueue
from shared.schemas import Experience, PromptTask, sample_id
from tests.learner.helpers import BAD, GOOD


@dataclass
class FakeFleet:
    redis: object
    run: str
    budget: int = 10**9  # prompt groups it may still produce (raise it to let more through)
    stale_prompt_ids: set[str] = field(default_factory=set)  # stamp these with weight version 0
    bad_prompt_ids: set[str] = field(default_factory=set)  # answer these with out-of-vocabulary token ids
    duplicate: bool = False  # push every experience twice (a fleet that retried after a crash)
    poison_keys: set[str] = field(default_factory=set)  # dataset positions ("e0-3") whose tasks fail every time
    permanent: bool = False  # poisoned tasks fail as a real worker fails a task that can never succeed
    hold_keys: set[str] = field(default_factory=set)  # positions whose tasks wait (unanswered) until removed
    flat_keys: set[str] = field(default_factory=set)  # positions answered with equal rewards (no GRPO signal)
    cut_keys: set[str] = field(default_factory=set)  # positions whose odd samples hit the length limit
    span_keys: set[str] = field(default_factory=set)  # positions whose samples span two versions (partial rollout)
    lag: int = 0  # runs ahead of the learner: stamps each group 0..lag versions behind the published one
    _waiting: list = field(default_factory=list)
    produced_groups: list[str] = field(default_factory=list)
    stopped: bool = False

    def __post_init__(self) -> None:
        # max_deliveries=1: a task it fails is dead-lettered at once (a real worker retries a few times first)
        self.prompts = StreamQueue(self.redis, keys.prompts_stream(self.run), "rollout", PromptTask, max_deliveries=1)
        self.experiences = StreamQueue(self.redis, keys.experiences_stream(self.run), "learner", Experience)

    def experiences_for(self, task: PromptTask, version: int) -> list[Experience]:
        prompt = [1] + [5 + b % 200 for b in str(task.prompt).encode()][:16]
        out = []
        flat = task.id.rsplit("-r", 1)[0] in self.flat_keys
        for i in range(task.n):
            good = flat or i % 2 == 0
            length = 2 + i % 3
            token = 99_999 if task.id in self.bad_prompt_ids else GOOD if good else BAD
            key = task.id.rsplit("-r", 1)[0]
            cut = key in self.cut_keys and i % 2 == 1
            spans = [(0, version - 1), (1, version)] if key in self.span_keys and version >= 1 else None
            out.append(Experience(
                id=sample_id(task.id, i), prompt_id=task.id, group_id=task.id, group_size=task.n, index=i,
                prompt_token_ids=prompt, response_token_ids=[token] * length,
                response_logprobs=[-5.5] * length, finish_reason="length" if cut else "stop",
                reward=1.0 if good else 0.0, weight_version=version - 1 if spans else version,
                version_spans=spans, label=task.label, grant=task.grant,
            ))
        return out

    async def stop(self, task: asyncio.Task) -> None:
        """Stop between reads (cancelling a blocked redis-py read can hang on its socket timeout)."""
        self.stopped = True
        try:
            await asyncio.wait_for(task, 10)
        except asyncio.TimeoutError:
            task.cancel()

    async def run_forever(self, consumer: str = "fake-0") -> None:
        while not self.stopped:
            try:
                await self._serve(consumer)
            except (RedisConnectionError, RedisTimeoutError, BusyLoadingError):  # Redis restarting: like a worker
                await asyncio.sleep(0.2)

    async def _serve(self, consumer: str) -> None:
        await self.prompts.ensure_group()
        while not self.stopped:
            if self.budget <= 0:
                await asyncio.sleep(0.05)
                continue
            released = [d for d in self._waiting if d.record.id.rsplit("-r", 1)[0] not in self.hold_keys]
            self._waiting = [d for d in self._waiting if d not in released]
            for d in released + await self.prompts.consume(consumer, count=1, block_ms=100):
                if d.record.id.rsplit("-r", 1)[0] in self.hold_keys:
                    self._waiting.append(d)
                    continue
                if d.record.id.rsplit("-r", 1)[0] in self.poison_keys:
                    await self.prompts.fail(d, "bad prompt task: the prompt is longer than the context",
                                            permanent=self.permanent)
                    continue
                raw = await self.redis.get(keys.weights_version(self.run))
                version = 0 if d.record.id in self.stale_prompt_ids else int(raw or 0)
                if self.lag:  # deterministic per attempt, so a re-issued prompt may come back fresher
                    version = max(0, version - sum(d.record.id.encode()) % (self.lag + 1))
                exps = self.experiences_for(d.record, version)
                await self.experiences.produce(exps)
                if self.duplicate:
                    await self.experiences.produce(exps)
                await self.prompts.ack([d.id])
                self.produced_groups.append(d.record.id)
                self.budget -= 1
