"""The pure stages of an RL step (:meth:`.rl_trainer.RLTrainer.train_step`) and the records between them.

A step reads as: prepare the batch (old and reference log-probs, critic values: forwards, in the trainer; then
:func:`step_kl` and :func:`step_scores`) -> advantages (the algorithm's) -> :func:`loss_mask` (the overlong kind and
the off-policy correction) -> updates (epochs of mini-batches, each with its :func:`update_counts`, cut into
passes, in the trainer) -> metrics (:func:`batch_metrics` and the trainer's own). The functions here are tensor
math on full-batch tensors, each testable alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.learner.algorithms.corrections import CorrectionFn, mismatch_metrics
from services.learner.algorithms.kl import kl_estimate
from services.learner.algorithms.length_shaping_settings import OverlongSettings
from services.learner.algorithms.masked import masked_mean
from services.learner.algorithms.normalize import RunningMeanStd
from services.learner.training.batch import RLBatch
from services.learner.training.collectives import all_sum


@dataclass(frozen=True)
class PreparedBatch:
    """What a step computes before its updates, full-batch tensors (``[B, R]`` unless noted)."""

    old_logprobs: torch.Tensor  # the actor's before the step (float, detached)
    reference_logprobs: torch.Tensor | None  # the frozen reference's, where the algorithm has one
    values: torch.Tensor | None  # the critic's before the step, where the algorithm has one
    kl: torch.Tensor  # per-token KL of the actor to the reference (zeros without one)
    scores: torch.Tensor  # [B] rewards after length shaping, normalisation and clipping
    # the fused one-pass step's log-probs and entropy, still carrying gradients (see RLTrainer._one_pass)
    fused: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True)
class LossMask:
    """Which tokens a step trains on and with which importance weights (``[B, R]``), and its statistics."""

    keep: torch.Tensor  # float: 1 for tokens in the loss (and in its denominators)
    weights: torch.Tensor  # detached importance weights of the off-policy correction
    stats: dict[str, torch.Tensor]  # scalar tensors: engine / learner mismatch and the correction's shares


@dataclass(frozen=True)
class LossInputs:
    """The full-batch tensors the passes of every update read, by row (``[B, R]``)."""

    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor  # the critic's targets
    mask: LossMask
    reference_logprobs: torch.Tensor | None  # for a KL loss
    values: torch.Tensor | None  # the critic's before the step (value clipping)
    fused: tuple[torch.Tensor, torch.Tensor] | None  # see PreparedBatch.fused


@dataclass(frozen=True)
class UpdateCounts:
    """One update's counts over all ranks: the denominators of its losses."""

    tokens: torch.Tensor  # tokens kept in the loss (at least 1)
    sequences: float  # sequences with a kept token
    action_tokens: torch.Tensor  # action tokens (at least 1): the value loss's
    samples: float  # sequences: the value loss's


@dataclass(frozen=True)
class Pass:
    """One forward/backward of an update: rows ``rows`` of the step batch, as the micro-batch ``batch``."""

    batch: RLBatch
    rows: torch.Tensor
    counts: UpdateCounts

    def cols(self, t: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` of a full-batch ``[B, R]`` tensor, cut to this pass's response width."""
        return t[self.rows][:, : self.batch.action_mask.shape[1]]


def step_kl(old_logprobs: torch.Tensor, reference_logprobs: torch.Tensor | None, estimator: str,
            action_mask: torch.Tensor) -> torch.Tensor:
    """[B, R] per-token KL estimate of the actor to the reference; zeros where there is no reference."""
    if reference_logprobs is None:
        return torch.zeros_like(action_mask)
    return kl_estimate(old_logprobs, reference_logprobs, estimator, action_mask)


def step_scores(raw: torch.Tensor, response_lengths: torch.Tensor, overlong: OverlongSettings,
                batch_scores: Sequence[float] | None, reward_stats: RunningMeanStd | None,
                reward_clip: float | None) -> torch.Tensor:
    """[B] the scores advantages start from: the rewards ``raw`` shaped by the ``overlong`` kind; normalised by
    the running statistics ``reward_stats`` (``None``: not normalised), which first take in the whole step
    batch's scores (``batch_scores`` on N ranks; else this batch's shaped ones); clipped to ``reward_clip``."""
    shaped = overlong.shape_scores(raw, response_lengths)
    scores = shaped
    if reward_stats is not None:  # statistics of the whole step batch: the same on every rank
        reward_stats.update(shaped if batch_scores is None else torch.tensor(list(batch_scores), dtype=torch.float32))
        scores = reward_stats.normalize(shaped)
    if reward_clip is not None:
        scores = scores.clamp(-reward_clip, reward_clip)
    return scores


def loss_mask(action_mask: torch.Tensor, truncated: torch.Tensor, overlong: OverlongSettings,
              correction: CorrectionFn,
              old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor) -> LossMask:
    """The tokens a step trains on: the action tokens of the samples the ``overlong`` kind keeps, less those the
    off-policy ``correction`` (of the learner's ``old_logprobs`` to the engine's) rejects; with its weights.
    The statistics are over all action tokens."""
    keep = action_mask * overlong.loss_keep(truncated).unsqueeze(-1)
    corrected = correction(old_logprobs, engine_logprobs, keep)
    stats = {**mismatch_metrics(old_logprobs, engine_logprobs, action_mask), **corrected.stats(action_mask)}
    return LossMask(keep=corrected.keep, weights=corrected.weights, stats=stats)


# what update_counts all-reduces per update (a rank with an empty shard joins with as many zeros)
UPDATE_COUNTS = 4


def update_counts(keep: torch.Tensor, action_mask: torch.Tensor, rows: torch.Tensor) -> UpdateCounts:
    """The counts of the update on rows ``rows`` of the step batch, summed over ranks (one all-reduce)."""
    local = torch.stack([keep[rows].sum().double(), (keep[rows].sum(-1) > 0).sum().double(),
                         action_mask[rows].sum().double(),
                         torch.tensor(float(len(rows)), dtype=torch.float64, device=keep.device)])
    counts = all_sum(local)
    return UpdateCounts(tokens=counts[0].to(keep.dtype).clamp(min=1.0), sequences=float(counts[1]),
                        action_tokens=counts[2].to(keep.dtype).clamp(min=1.0), samples=float(counts[3]))


def batch_metrics(batch: RLBatch, prepared: PreparedBatch, advantages: torch.Tensor, returns: torch.Tensor,
                  mask: LossMask) -> dict[str, float]:
    """The step batch's numbers: rewards and scores, KL, advantages and returns, the loss mask's statistics,
    truncation and response length."""
    action_mask = batch.action_mask
    adv_mean = masked_mean(advantages, action_mask)
    return {
        "reward_mean": float(batch.scores.mean()),
        "reward_std": float(batch.scores.std(unbiased=False)),
        "score_mean": float(prepared.scores.mean()),
        "kl": float(masked_mean(prepared.kl, action_mask)) if prepared.reference_logprobs is not None else 0.0,
        "advantage_mean": float(adv_mean),
        "advantage_std": float(masked_mean((advantages - adv_mean) ** 2, action_mask).sqrt()),
        "return_mean": float(masked_mean(returns, action_mask)),
        **{k: float(v) for k, v in mask.stats.items()},
        "truncated_frac": float(batch.truncated.float().mean()),
        "response_len_mean": float(action_mask.sum(-1).mean()),
    }
