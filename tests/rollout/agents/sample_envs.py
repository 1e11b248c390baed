"""Environments for tests, loadable by import path (``tests.rollout.agents.sample_envs:<Name>``): ones that
misbehave in each way the multi-turn rollout must survive, and a counter of what each was asked."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

from services.rollout.agents.environments import EnvReply, EnvStart
from services.rollout.agents.tools import Tool
from shared.schemas import PromptTask

CALLS: Counter[str] = Counter()  # "<class>.<method>" -> times called (in this process)
SEEN: list[dict[str, Any]] = []  # the assistant messages step() received, in order


class _Base:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    async def reset(self, task: PromptTask) -> EnvStart:
        CALLS[f"{type(self).__name__}.reset"] += 1
        return EnvStart(messages=[{"role": "user", "content": "start"}], tools=self.tools())

    def tools(self) -> list[Tool]:
        return []

    async def step(self, message: dict[str, Any]) -> EnvReply:
        CALLS[f"{type(self).__name__}.step"] += 1
        SEEN.append(message)
        return EnvReply(done=True, reward=1.0)

    async def close(self) -> None:
        CALLS[f"{type(self).__name__}.close"] += 1


class Raises(_Base):
    async def step(self, message):
        CALLS["Raises.step"] += 1
        raise RuntimeError("the environment broke")


class Hangs(_Base):
    async def step(self, message):
        CALLS["Hangs.step"] += 1
        await asyncio.sleep(3600)


class BlocksSync(_Base):
    def step(self, message):  # a plain (blocking) method: run in a thread, still bounded by the timeout
        CALLS["BlocksSync.step"] += 1
        import time

        time.sleep(2.0)
        return EnvReply(done=True, reward=1.0)


class Garbage(_Base):
    async def step(self, message):
        CALLS["Garbage.step"] += 1
        return {"reply": "not an EnvReply"}


class NanReward(_Base):
    async def step(self, message):
        CALLS["NanReward.step"] += 1
        return EnvReply(done=True, reward=math.nan)


class BadMessages(_Base):
    async def step(self, message):
        CALLS["BadMessages.step"] += 1
        return EnvReply(messages=[{"role": "robot", "content": 3}])


class ResetRaises(_Base):
    async def reset(self, task):
        CALLS["ResetRaises.reset"] += 1
        raise ConnectionError("cannot reach the environment server")


class FlakyOnce(_Base):
    """Fails the first step it is ever asked (per process), then works."""

    async def step(self, message):
        CALLS["FlakyOnce.step"] += 1
        if CALLS["FlakyOnce.step"] == 1:
            raise RuntimeError("transient")
        return EnvReply(done=True, reward=0.75)


def _boom(x: str) -> str:
    raise OSError("disk on fire")


async def _forever(x: str) -> str:
    await asyncio.sleep(3600)
    return x


class ToolRaises(_Base):
    def tools(self):
        return [Tool("boom", _boom, parameters={"type": "object", "properties": {"x": {"type": "string"}}})]


class ToolHangs(_Base):
    def tools(self):
        return [Tool("boom", _forever, parameters={"type": "object", "properties": {"x": {"type": "string"}}})]


class NeverDone(_Base):
    """Answers every turn with a user message and never ends: the turn or context limit must."""

    async def step(self, message):
        CALLS["NeverDone.step"] += 1
        return EnvReply(messages=[{"role": "user", "content": "again"}])


class NoReward(_Base):
    """Done after two model turns without a reward: the reward service scores the episode."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.turns = 0

    async def step(self, message):
        CALLS["NoReward.step"] += 1
        SEEN.append(message)
        self.turns += 1
        if self.turns >= 2:
            return EnvReply(done=True)
        return EnvReply(messages=[{"role": "user", "content": "once more"}])


def not_an_env(**kwargs):
    return "a string"
