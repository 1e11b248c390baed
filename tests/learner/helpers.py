"""Synthetic experiences and settings for learner tests."""

from __future__ import annotations

from pathlib import Path

import torch

from services.learner.settings import LearnerSettings
from shared.schemas import Experience, sample_id

PROMPT = [1, 10, 20, 30]  # <s> + three byte tokens
GOOD, BAD = 100, 200  # reward favours responses made of GOOD tokens


def settings(model_dir: Path, tmp_path: Path, **sections) -> LearnerSettings:
    base = {
        "model": {"actor": str(model_dir), "device": "cpu"},
        "data": {"path": str(tmp_path / "prompts.jsonl")},
        "run_dir": str(tmp_path / "run"),
        "optim": {"actor_lr": 1e-3, "critic_lr": 1e-3, "warmup_ratio": 0.0, "schedule": "constant"},
        "train": {"groups_per_step": 2, "micro_batch_size": 4, "torch_threads": 1},
        "rollout": {"group_size": 4},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) and key != "algorithm" else value
    return LearnerSettings(**base)


def group(prompt_id: str, responses: list[list[int]], rewards: list[float], version: int = 0,
          logprobs: list[list[float]] | None = None, prompt: list[int] | None = None) -> list[Experience]:
    n = len(responses)
    return [
        Experience(
            id=sample_id(prompt_id, i), prompt_id=prompt_id, group_id=prompt_id, group_size=n, index=i,
            prompt_token_ids=prompt or PROMPT, response_token_ids=r,
            response_logprobs=(logprobs[i] if logprobs else [-5.5] * len(r)),
            finish_reason="stop", reward=rewards[i], weight_version=version,
        )
        for i, r in enumerate(responses)
    ]


def good_bad_batch(step: int, n_groups: int = 2) -> list[Experience]:
    """Groups of 4: two GOOD responses (reward 1) and two BAD ones (reward 0), lengths varying."""
    out: list[Experience] = []
    for g in range(n_groups):
        length = 2 + (step + g) % 3
        out += group(f"s{step}-g{g}", [[GOOD] * length, [BAD] * length, [GOOD] * (length + 1), [BAD] * (length - 1)],
                     [1.0, 0.0, 1.0, 0.0])
    return out


def response_logprob(trainer, response: list[int], prompt: list[int] | None = None) -> float:
    """Sum of the actor's logprobs of ``response`` after ``prompt``."""
    from services.learner.training.batch import action_logprobs, build_rl_batch

    batch = build_rl_batch(group("probe", [response], [0.0], prompt=prompt), trainer.pad_id).to(trainer.device)
    with torch.no_grad():
        lp, _ = action_logprobs(trainer.actor.model, batch)
    return float(lp.sum())
