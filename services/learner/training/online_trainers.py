"""The online preference algorithms' trainers: what the RL run owner calls with each step's complete groups
(``train_step(experiences)``, as :class:`~services.learner.training.rl_trainer.RLTrainer`), so they consume the
queue exactly as GRPO does (staleness bound, grants, dynamic sampling, checkpoints, resume, weight publishing).

- :class:`OnlineDPOTrainer`: each group's best and worst sample (score gap >= ``min_gap``) form a DPO pair.
- :class:`RejectionSamplingTrainer`: each group's best sample with a score >= ``threshold`` is an SFT pair.

A step whose groups give nothing to train on still counts (its groups are consumed and acknowledged); its
metrics say so (``pairs`` / ``kept`` 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from services.learner.algorithms.pair_selection import Pick, dpo_picks, rejection_picks
from services.learner.settings import LearnerSettings
from services.learner.training.base import TrainerBase
from services.learner.training.dpo_trainer import DPOTrainer, TokenPair
from services.learner.training.sft_trainer import SFTTrainer
from shared.schemas import Experience


def by_group(experiences: Sequence[Experience]) -> list[list[Experience]]:
    """Experiences by group, groups in first-seen order, samples by their index in the group."""
    groups: dict[str, list[Experience]] = {}
    for e in experiences:
        groups.setdefault(e.group_id, []).append(e)
    return [sorted(g, key=lambda e: e.index) for g in groups.values()]


def _reward_metrics(experiences: Sequence[Experience], groups: list[list[Experience]], picks: list[Pick]) -> dict:
    rewards = [float(e.reward) for e in experiences]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return {"reward_mean": mean, "reward_std": std, "groups": float(len(groups)),
            "groups_used": float(len(picks)), "groups_used_frac": len(picks) / max(len(groups), 1),
            "response_length": sum(len(e.response_token_ids) for e in experiences) / len(experiences)}


class OnlineDPOTrainer(DPOTrainer):
    def __init__(self, settings: LearnerSettings, total_steps: int, resume_dir: Path | None = None,
                 local_rank: int = 0) -> None:
        super().__init__(settings, total_steps, resume_dir, local_rank, pairs_per_step=settings.train.groups_per_step)

    def train_step(  # type: ignore[override]  # an online trainer's step takes the RL runner's experiences
            self, experiences: Sequence[Experience], batch_scores=None) -> dict[str, float]:
        groups = by_group(experiences)
        picks = dpo_picks([[float(e.reward) for e in g] for g in groups], self.dpo.min_gap)
        pairs = [TokenPair(groups[p.group][p.chosen].prompt_token_ids, groups[p.group][p.chosen].response_token_ids,
                           groups[p.group][p.rejected].response_token_ids)
                 for p in picks if p.rejected is not None]  # (every DPO pick is a pair)
        metrics = self.train_pairs(pairs)
        metrics.update(_reward_metrics(experiences, groups, picks))
        if picks:
            metrics["pair_gap_mean"] = sum(p.gap for p in picks) / len(picks)
        return metrics


class RejectionSamplingTrainer(SFTTrainer):
    def __init__(self, settings: LearnerSettings, total_steps: int, resume_dir: Path | None = None,
                 local_rank: int = 0) -> None:
        self.sft = settings.algorithm
        TrainerBase.__init__(self, settings, total_steps, settings.train.groups_per_step, resume_dir, local_rank)
        if resume_dir is not None:
            self.restore(resume_dir)

    def train_step(  # type: ignore[override]  # an online trainer's step takes the RL runner's experiences
            self, experiences: Sequence[Experience], batch_scores=None) -> dict[str, float]:
        groups = by_group(experiences)
        picks = rejection_picks([[float(e.reward) for e in g] for g in groups], self.sft.threshold)
        kept = [groups[p.group][p.chosen] for p in picks]
        if kept:
            metrics = super().train_step([(e.prompt_token_ids, e.response_token_ids) for e in kept])
        else:
            self.global_step += 1
            metrics = {"step": float(self.global_step), "samples": 0.0}
        metrics.update(_reward_metrics(experiences, groups, picks))
        metrics["kept"] = float(len(kept))
        if kept:
            metrics["kept_reward_mean"] = sum(float(e.reward) for e in kept) / len(kept)
        return metrics
