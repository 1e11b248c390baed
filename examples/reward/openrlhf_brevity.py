"""An OpenRLHF-style reward function: ``reward_func(queries, prompts, labels, **kwargs)``."""

from __future__ import annotations


def reward_func(queries, prompts, labels, target_words: int = 200, **kwargs):
    """Up to 0 for responses within ``target_words`` words, linearly down to -1 at twice that."""
    rewards = []
    for query, prompt in zip(queries, prompts):
        words = len(query[len(prompt):].split())
        rewards.append(-min(1.0, max(0, words - target_words) / target_words))
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"brevity": rewards}}
