"""Policy losses as plug-ins: typed inputs, typed outputs, chosen by ``policy_loss.kind`` through the
policy-loss plug-in point (:data:`.policy_loss_settings.POLICY_LOSSES`): ``fn(inputs, **the settings' fields)``.

Every loss maps :class:`PolicyLossInputs` (the current log-probabilities with their graph, the behaviour
log-probabilities of the step, advantages, the action mask with the off-policy correction's rejections
applied, and its importance weights) to a :class:`PolicyLossOutput`: a ``[B, T]`` per-token loss (the
trainer reduces it with the loss's aggregation) plus what the step reports (ratio, clipped tokens).
A custom loss by import path gets the same inputs (``CustomLoss`` settings).

- ``ppo``: clipped surrogate, clip-higher, dual clip (:func:`~.losses.clipped_surrogate`).
- ``dr_grpo``: the clipped surrogate divided by a constant, token sums per sequence (no length bias).
- ``gspo``: sequence-level ratio ``exp(mean_t log r_t)``, clipped per sequence, applied to every token.
- ``cispo``: ``-sg(clip(r)) * A * log pi``: the IS weight is clipped, the gradient never dropped.
- ``dppo``: tokens whose probability moved past a bound in the advantage's direction get no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from services.learner.algorithms.loss_terms import PolicyLossOutput, clipped_surrogate
from services.learner.algorithms.policy_loss_settings import POLICY_LOSSES, CustomLoss
from shared.plugins import kwargs_of
from shared.service_kit.loader import load_object

__all__ = ["PolicyLoss", "PolicyLossFn", "PolicyLossInputs", "PolicyLossOutput", "build_policy_loss"]

RATIO_LOG_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyLossInputs:
    logp: torch.Tensor  # [B, T] current policy log-probs of the sampled tokens (with grad)
    old_logp: torch.Tensor  # [B, T] behaviour log-probs (learner, start of the step), no grad
    advantages: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float: action tokens still in the loss (after the off-policy correction)
    weights: torch.Tensor  # [B, T] importance weights of the off-policy correction (detached; 1 = none)


def _ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return (logp - old_logp).clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP).exp()


def ppo_loss(x: PolicyLossInputs, eps_low: float, eps_high: float, dual_clip: float | None = None) -> PolicyLossOutput:
    out = clipped_surrogate(x.logp, x.old_logp, x.advantages, eps_low, eps_high, dual_clip)
    return PolicyLossOutput(loss=out.loss * x.weights * x.mask, ratio=out.ratio.detach(), clipped=out.clipped * x.mask)


def dr_grpo_loss(x: PolicyLossInputs, eps_low: float, eps_high: float, normalizer: int) -> PolicyLossOutput:
    out = ppo_loss(x, eps_low, eps_high)
    return PolicyLossOutput(loss=out.loss / normalizer, ratio=out.ratio, clipped=out.clipped)


def gspo_loss(x: PolicyLossInputs, eps_low: float, eps_high: float) -> PolicyLossOutput:
    """``s_i = exp(mean_t (logp - old_logp))``; per token ``s_it = sg(s_i) * exp(logp_t - sg(logp_t))`` (the
    value of ``s_i``, the gradient of token t's own log-prob, as in the paper's token-level GSPO form)."""
    m = x.mask
    n = m.sum(-1).clamp(min=1.0)
    log_s = (((x.logp - x.old_logp) * m).sum(-1) / n).clamp(-RATIO_LOG_CLAMP, RATIO_LOG_CLAMP)  # [B]
    s = log_s.exp().detach().unsqueeze(-1)
    s_tok = s * (x.logp - x.logp.detach()).exp()
    surr1 = s_tok * x.advantages
    surr2 = s_tok.clamp(1 - eps_low, 1 + eps_high) * x.advantages
    clipped = (surr2 < surr1).to(m.dtype) * m
    loss = -torch.min(surr1, surr2) * x.weights * m
    return PolicyLossOutput(loss=loss, ratio=s.expand_as(m).detach() * m, clipped=clipped)


def cispo_loss(x: PolicyLossInputs, eps_low: float, eps_high: float) -> PolicyLossOutput:
    m = x.mask
    ratio = _ratio(x.logp, x.old_logp).detach()
    w = ratio.clamp(1 - eps_low, 1 + eps_high)
    clipped = (w != ratio).to(m.dtype) * m
    loss = -w * x.advantages * x.logp * x.weights * m
    return PolicyLossOutput(loss=loss, ratio=ratio * m, clipped=clipped)


def dppo_loss(x: PolicyLossInputs, delta_low: float, delta_high: float) -> PolicyLossOutput:
    m = x.mask
    moved = (x.logp.exp() - x.old_logp.exp()).detach()
    up, down = x.advantages > 0, x.advantages < 0
    dropped = ((up & (moved > delta_high)) | (down & (moved < -delta_low))).to(m.dtype) * m
    ratio = _ratio(x.logp, x.old_logp)
    loss = -x.advantages * ratio * (1 - dropped) * x.weights * m
    return PolicyLossOutput(loss=loss, ratio=ratio.detach() * m, clipped=dropped)


PolicyLossFn = Callable[[PolicyLossInputs], PolicyLossOutput]


@runtime_checkable
class PolicyLoss(Protocol):
    """What a policy-loss kind's implementation is (the base of the policy-loss plug-in point, checked when it
    loads): ``fn(inputs, **settings) -> PolicyLossOutput``, ``settings`` its settings' fields (``custom``: its
    ``kwargs``)."""

    def __call__(self, x: PolicyLossInputs, **settings: Any) -> PolicyLossOutput: ...


def build_policy_loss(settings) -> PolicyLossFn:
    """The loss function ``settings`` (one registered kind's settings, ``algorithm.policy_loss``) selects: the
    kind's function with the settings' fields as keyword arguments (``custom``: the function at ``path`` with
    ``kwargs``), its output checked at every call."""
    if settings.kind not in POLICY_LOSSES:
        raise ValueError(POLICY_LOSSES.unknown(settings.kind))
    if isinstance(settings, CustomLoss):
        fn = load_object(settings.path, PolicyLoss, what="policy loss", keywords=settings.kwargs)
        kwargs, what = dict(settings.kwargs), settings.path
    else:  # checked against PolicyLoss (and its settings' fields) when the point loads it
        fn, kwargs, what = POLICY_LOSSES.load(settings.kind), kwargs_of(settings), settings.kind

    def call(x: PolicyLossInputs) -> PolicyLossOutput:
        out = fn(x, **kwargs)
        if not isinstance(out, PolicyLossOutput):
            raise TypeError(f"policy loss {what} returned {type(out).__name__}, not PolicyLossOutput")
        if out.loss.shape != x.logp.shape:
            raise ValueError(f"policy loss {what} returned a loss of shape {tuple(out.loss.shape)}; "
                             f"it must be per token, {tuple(x.logp.shape)}")
        return out

    return call
