"""The online preference trainers on synthetic groups (the tiny model): online DPO raises the chosen side's
log-probability over the rejected one's; rejection sampling trains only each group's best sample above the
threshold; a step with nothing to train on counts without moving the weights."""

from __future__ import annotations

import torch

from services.learner.training.online_trainers import OnlineDPOTrainer, RejectionSamplingTrainer, by_group
from tests.learner.helpers import BAD, GOOD, good_bad_batch, group, response_logprob, settings


def _weights(trainer):
    return [p.detach().clone() for p in trainer.actor.model.parameters()]


def test_online_dpo_prefers_the_best_of_each_group(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "online_dpo", "beta": 0.5, "min_gap": 0.5},
                 optim={"actor_lr": 1e-2})
    trainer = OnlineDPOTrainer(s, total_steps=4)
    before = response_logprob(trainer, [GOOD] * 3) - response_logprob(trainer, [BAD] * 3)
    metrics = {}
    for step in range(3):
        metrics = trainer.train_step(good_bad_batch(step))
    after = response_logprob(trainer, [GOOD] * 3) - response_logprob(trainer, [BAD] * 3)
    assert after > before + 1.0, (before, after)
    assert metrics["pairs"] == 2.0 and metrics["groups_used"] == 2.0
    assert metrics["rewards/accuracies"] == 1.0 and metrics["rewards/margins"] > 0


def test_online_dpo_step_without_pairs_counts_and_changes_nothing(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "online_dpo", "min_gap": 0.5})
    trainer = OnlineDPOTrainer(s, total_steps=2)
    w = _weights(trainer)
    exps = group("p0", [[GOOD] * 2, [BAD] * 2], [1.0, 0.8]) + group("p1", [[GOOD], [BAD]], [0.0, 0.0])
    metrics = trainer.train_step(exps)
    assert metrics["pairs"] == 0.0 and trainer.global_step == 1
    assert all(torch.equal(a, b) for a, b in zip(w, _weights(trainer)))


def test_rejection_sampling_trains_the_best_above_threshold(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "rejection_sampling", "threshold": 1.0},
                 optim={"actor_lr": 1e-2})
    trainer = RejectionSamplingTrainer(s, total_steps=4)
    before = response_logprob(trainer, [GOOD] * 3)
    for step in range(3):
        metrics = trainer.train_step(good_bad_batch(step))
    assert response_logprob(trainer, [GOOD] * 3) > before + 1.0
    assert metrics["kept"] == 2.0 and metrics["kept_reward_mean"] == 1.0
    # no group reaches the threshold: nothing trained
    w = _weights(trainer)
    metrics = trainer.train_step(group("low", [[GOOD], [BAD]], [0.5, 0.0]))
    assert metrics["kept"] == 0.0 and all(torch.equal(a, b) for a, b in zip(w, _weights(trainer)))


def test_by_group_orders_samples():
    exps = list(reversed(group("a", [[1], [2]], [0.0, 1.0]))) + group("b", [[3]], [0.0])
    assert [[e.index for e in g] for g in by_group(exps)] == [[0, 1], [0]]
