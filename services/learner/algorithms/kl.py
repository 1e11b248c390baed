"""KL(pi || pi_ref) estimators per token (Schulman, "Approximating KL divergence"; OpenRLHF ``compute_approx_kl``).

With ``log_ratio = logp - ref_logp`` of the sampled token:

- ``k1 = log_ratio`` — unbiased, high variance, can be negative.
- ``k2 = log_ratio**2 / 2`` — biased, low variance, always >= 0; its gradient is the KL's gradient.
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` — unbiased, low variance, always >= 0 (clamped to
  [-10, 10] like OpenRLHF for numerical safety).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp) ** 2 / 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    neg_log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return (neg_log_ratio.exp() - 1 - neg_log_ratio).clamp(-10.0, 10.0)


KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, mask: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate by estimator name, 0 on masked positions."""
    return KL_ESTIMATORS[estimator](logp, ref_logp) * mask.to(logp.dtype)
