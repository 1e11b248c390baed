"""``echo``: the trivial environment — the user says the same line back for ``turns`` turns, then it is done.

No reward of its own unless ``reward`` is given (then every episode ends with it; else the reward service
scores the last answer). Used by the benchmark and by tests of the multi-turn machinery, where only the turns
matter.
"""

from __future__ import annotations

from typing import Any

from services.rollout.agents.environments import EnvReply, EnvStart
from shared.schemas import PromptTask


class EchoEnv:
    def __init__(self, turns: int = 2, reply: str = "go on", reward: float | None = None) -> None:
        self.turns, self.reply, self.reward, self.seen = turns, reply, reward, 0

    async def reset(self, task: PromptTask) -> EnvStart:
        if isinstance(task.prompt, list):
            return EnvStart(messages=[m.model_dump() for m in task.prompt])
        return EnvStart(messages=[{"role": "user", "content": task.prompt or "hello"}])

    async def step(self, message: dict[str, Any]) -> EnvReply:
        self.seen += 1
        if self.seen >= self.turns:
            return EnvReply(done=True, reward=self.reward)
        return EnvReply(messages=[{"role": "user", "content": self.reply}])

    async def close(self) -> None:
        return None
