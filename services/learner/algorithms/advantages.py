"""Advantage and return estimators: GAE, discounted returns, group / leave-one-out baselines.

Shapes: token tensors are ``[B, T]`` aligned with response tokens, ``mask`` is 1 on action tokens.
Scalar per-sample tensors are ``[B]``; ``groups`` is ``[B]`` of integer group labels (samples of one
prompt share a label). Masked positions are skipped by the recursions, so a mask with holes (e.g.
tool-output tokens inside a multi-turn response) carries values across the hole.
"""

from __future__ import annotations

import torch


def end_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sample's scalar reward on its last action token; 0 elsewhere.

    A sample with no action token gets no reward (it has nothing to credit).
    """
    mask = mask.to(scores.dtype)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).max(dim=1).values  # [B]
    out = torch.zeros_like(mask)
    has_action = last >= 0
    rows = torch.nonzero(has_action, as_tuple=True)[0]
    out[rows, last[has_action]] = scores[has_action]
    return out


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lambd: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over action tokens. Returns ``(advantages, returns)``.

    ``delta_t = r_t + gamma * V_{t'} - V_t`` where ``t'`` is the next *unmasked* position (0 past the
    end), ``A_t = delta_t + gamma * lambd * A_{t'}``, ``returns = A + V``. Masked positions get 0.
    """
    mask = mask.to(values.dtype)
    rewards = rewards * mask
    values = values * mask
    batch, length = rewards.shape
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
    last_adv = torch.zeros_like(next_value)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lambd * last_adv
        advantages[:, t] = adv_t * m
        next_value = values[:, t] * m + (1 - m) * next_value
        last_adv = adv_t * m + (1 - m) * last_adv
    returns = (advantages + values) * mask
    return advantages, returns


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t'}`` over action tokens (``t'`` the next unmasked position)."""
    mask = mask.to(rewards.dtype)
    rewards = rewards * mask
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        g = rewards[:, t] + gamma * running
        returns[:, t] = g * m
        running = g * m + (1 - m) * running
    return returns


def _group_sum(values: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Each sample's group total of ``values``."""
    totals = torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, inverse, values)
    return totals[inverse]


def _group_index(groups: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense group indices 0..G-1 for arbitrary integer labels, and G."""
    labels, inverse = torch.unique(groups, return_inverse=True)
    return inverse, int(labels.numel())


def group_advantages(
    scores: torch.Tensor, groups: torch.Tensor, norm_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: ``(r - mean_group) / (std_group + eps)``; without ``norm_std`` just ``r - mean_group`` (Dr. GRPO).

    The standard deviation is the unbiased (Bessel-corrected) one, as ``torch.std`` and GRPO use; a
    group of one sample has std 0.
    """
    inverse, n = _group_index(groups)
    counts = _group_sum(torch.ones_like(scores), inverse, n)
    centred = scores - _group_sum(scores, inverse, n) / counts
    if not norm_std:
        return centred
    sq = _group_sum(centred**2, inverse, n)
    std = torch.where(counts > 1, (sq / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return centred / (std + eps)


def rloo_advantages(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """RLOO: ``r_i - mean_{j != i} r_j`` within each group (0 for a group of one sample)."""
    inverse, n = _group_index(groups)
    sums = _group_sum(scores, inverse, n)
    counts = _group_sum(torch.ones_like(scores), inverse, n)
    baseline = (sums - scores) / (counts - 1).clamp(min=1)
    return torch.where(counts > 1, scores - baseline, torch.zeros_like(scores))
