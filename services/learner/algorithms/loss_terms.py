"""Per-token losses and how they are reduced to a scalar.

Each loss function returns a ``[B, T]`` tensor (no reduction); :func:`aggregate` reduces it with one
of the named modes. Reductions accept the *global* token / sequence count of the mini-batch, so
micro-batches accumulated by gradient accumulation add up to exactly the mini-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PolicyLossOutput:
    """What a policy loss returns, the one type for the built-in losses, custom ones (``policy_losses``) and
    :func:`clipped_surrogate` (whose loss is before importance weights and mask; a registered loss applies them)."""

    loss: torch.Tensor  # [B, T] per-token loss, not yet aggregated
    ratio: torch.Tensor  # [B, T] pi / pi_old, the ratio the loss used, for metrics
    clipped: torch.Tensor  # [B, T] 1.0 where the loss clipped or dropped this token's gradient


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> PolicyLossOutput:
    """PPO's clipped objective with separate low / high clip ranges (DAPO "clip-higher").

    ``loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)``. With ``dual_clip = c > 1``
    the loss of negative-advantage tokens is capped at ``-c * A`` (Ye et al. 2020), as OpenRLHF does.
    """
    ratio = (logp - old_logp).clamp(-20.0, 20.0).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    clip1 = torch.min(surr1, surr2)
    clipped = (surr2 < surr1).to(logp.dtype)
    if dual_clip is None:
        return PolicyLossOutput(loss=-clip1, clipped=clipped, ratio=ratio)
    clip2 = torch.max(clip1, dual_clip * advantages)
    neg = advantages < 0
    dual_clipped = (neg & (clip2 > clip1)).to(logp.dtype)
    loss = -torch.where(neg, clip2, clip1)
    return PolicyLossOutput(loss=loss, clipped=torch.maximum(clipped, dual_clipped), ratio=ratio)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_eps: float | None = 0.2
) -> torch.Tensor:
    """``0.5 * max((V_clip - R)^2, (V - R)^2)`` with ``V_clip = V_old + clip(V - V_old, -eps, eps)``."""
    unclipped = (values - returns) ** 2
    if clip_eps is None:
        return 0.5 * unclipped
    v_clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    return 0.5 * torch.max((v_clipped - returns) ** 2, unclipped)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: ``logsumexp(z) - sum softmax(z) z``."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


# ---- aggregation -------------------------------------------------------------------------------

Aggregator = Callable[[torch.Tensor, torch.Tensor, float | torch.Tensor | None, float | None], torch.Tensor]


def _token_mean(loss: torch.Tensor, mask: torch.Tensor, num_tokens: float | torch.Tensor | None,
                num_seqs: float | None) -> torch.Tensor:
    denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1.0)
    return (loss * mask).sum() / denom


def _seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor, num_tokens: float | torch.Tensor | None,
                        num_seqs: float | None) -> torch.Tensor:
    denom = num_seqs if num_seqs is not None else loss.shape[0]
    return (loss * mask).sum(-1).sum() / max(denom, 1)


def _seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, num_tokens: float | torch.Tensor | None,
                         num_seqs: float | None) -> torch.Tensor:
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    denom = num_seqs if num_seqs is not None else loss.shape[0]
    return per_seq.sum() / max(denom, 1)


AGGREGATORS: dict[str, Aggregator] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
}


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    - ``token-mean``: sum over all action tokens / number of action tokens (long answers weigh more).
    - ``seq-mean-token-sum``: per-sequence sum, averaged over sequences (Dr. GRPO style).
    - ``seq-mean-token-mean``: per-sequence mean, averaged over sequences (original GRPO).

    ``num_tokens`` / ``num_seqs`` override the denominators with mini-batch totals when this call
    sees one micro-batch of a larger mini-batch.
    """
    return AGGREGATORS[mode](loss, mask.to(loss.dtype), num_tokens, num_seqs)
