"""reasoning-gym task generators as a prompt source and as an environment with their own scoring.

``reasoning_gym_tasks(dataset, size=, seed=, n=)`` makes prompt tasks from a procedural dataset (no dataset hub):
each names its entry (``metadata.reasoning_gym = {dataset, size, seed, index}``) and the ``reasoning_gym``
environment. The environment rebuilds the same dataset (cached per process), shows the question, takes the
model's first answer (inside ``<answer>...</answer>`` when it writes that, else its last line) and scores it
with the dataset's own ``score_answer`` (the reward, in [0, 1]). Needs the ``agents`` extra (``reasoning-gym``).
"""

from __future__ import annotations

import functools
from typing import Any

from services.rollout.agents.environments import EnvReply, EnvStart
from shared.schemas import ChatMessage, PromptTask


@functools.lru_cache(maxsize=32)
def dataset(name: str, size: int, seed: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed)


def reasoning_gym_tasks(name: str, *, size: int, seed: int, n: int = 1, system: str | None = None,
                        id_prefix: str | None = None) -> list[PromptTask]:
    """One prompt task per entry of the dataset, rolled out ``n`` times each by the ``reasoning_gym`` environment."""
    ds = dataset(name, size, seed)
    tasks = []
    for i in range(size):
        entry = ds[i]
        messages = [ChatMessage(role="system", content=system)] if system else []
        messages.append(ChatMessage(role="user", content=entry["question"]))
        tasks.append(PromptTask(
            id=f"{id_prefix or name}-{seed}-{i}", prompt=messages, label=entry["answer"], n=n,
            metadata={"environment": "reasoning_gym",
                      "reasoning_gym": {"dataset": name, "size": size, "seed": seed, "index": i}},
        ))
    return tasks


def final_answer(text: str) -> str:
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text)
    if tagged is not None:
        return tagged
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class ReasoningGymEnv:
    """One question of a reasoning-gym dataset; done after the model's first answer."""

    def __init__(self) -> None:
        self.ds: Any = None
        self.entry: dict[str, Any] | None = None

    async def reset(self, task: PromptTask) -> EnvStart:
        ref = task.metadata.get("reasoning_gym")
        if not isinstance(ref, dict) or not {"dataset", "size", "seed", "index"} <= ref.keys():
            raise ValueError("the task's metadata.reasoning_gym must name {dataset, size, seed, index} "
                             "(reasoning_gym_tasks() writes it)")
        self.ds = dataset(str(ref["dataset"]), int(ref["size"]), int(ref["seed"]))
        self.entry = self.ds[int(ref["index"])]
        if isinstance(task.prompt, list):
            return EnvStart(messages=[m.model_dump() for m in task.prompt])
        return EnvStart(messages=[{"role": "user", "content": self.entry["question"]}])

    async def step(self, message: dict[str, Any]) -> EnvReply:
        score = float(self.ds.score_answer(final_answer(message.get("content") or ""), self.entry))
        return EnvReply(done=True, reward=score, components={"reasoning_gym": score})

    async def close(self) -> None:
        return None
