"""Off-policy corrections between the engine that sampled a sequence and the learner that trains on it.

The learner recomputes the log-probabilities of the sampled tokens (``learner_lp``, the behaviour policy as
the trainer sees it); the rollout engine recorded its own (``engine_lp``) while sampling, possibly with
older weights (async RL) and always with other kernels (vLLM / SGLang / HF). The ratio

    rho_t = exp(learner_lp_t - engine_lp_t)

corrects for both. Each correction below is a small pure function of ``(learner_lp, engine_lp, mask)``
returning a :class:`Correction`: per-token importance ``weights`` (detached) that multiply the policy
loss, and a ``keep`` mask of the tokens that stay in the loss. A token (or sequence) a correction rejects
leaves the loss *and* its denominator (weighting it by 0 but counting it would shrink every other token's
gradient; slime #657 / verl #3915). Selected by ``algorithm.correction`` through the correction plug-in point
(``.correction_settings.CORRECTIONS``); ``custom`` takes a function of your own by import path.

- ``tis``: token-level truncated IS, ``w = min(rho, cap)`` (Yao et al. 2025; today's default).
- ``mis``: masked IS: tokens (``level: token``) or whole sequences (``level: sequence``, ratio = product of
  the token ratios) whose ratio falls outside ``[low, high]`` are rejected; the rest keep ``w = rho``.
- ``geo_seq``: sequence-level IS with the geometric-mean ratio ``exp(mean_t log rho_t)``, truncated at
  ``cap``, one weight for every token of the sequence; sequences outside ``[low, high]`` (if set) rejected.
- ``icepop``: IcePop's two-sided token masking (Ring-1T): tokens with ``rho`` outside ``[alpha, beta]``
  are rejected, the rest keep ``w = rho``.
- ``none``: ``w = 1``, everything kept.

:func:`mismatch_metrics` measures the gap itself every step (k3 KL, mean and max absolute log-prob
difference), whatever correction is on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from services.learner.algorithms.correction_settings import CORRECTIONS, CustomCorrection
from shared.plugins import kwargs_of
from shared.service_kit.loader import load_object

LOG_CLAMP = 20.0  # |log rho| beyond this is a numerical accident, not information


@dataclass(frozen=True)
class Correction:
    weights: torch.Tensor  # [B, T] detached importance weights (1 where nothing to correct)
    keep: torch.Tensor  # [B, T] float, 1 for tokens that stay in the loss (already multiplied by mask)
    capped: torch.Tensor | None = None  # [B, T] float, 1 where truncation lowered the weight

    def stats(self, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Scalar tensors (no host sync): the share of action tokens rejected and capped, and the mean weight
        of the kept ones."""
        m = mask.to(self.keep.dtype)
        n = m.sum().clamp(min=1.0)
        kept = self.keep.sum().clamp(min=1.0)
        capped = (self.capped * self.keep).sum() / kept if self.capped is not None else torch.zeros((), device=m.device)
        return {"is_rejected_frac": ((m - self.keep).clamp(min=0.0)).sum() / n,
                "is_capped_frac": capped,
                "is_weight_mean": (self.weights * self.keep).sum() / kept}


def _log_ratio(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((learner_lp - engine_lp) * mask).clamp(-LOG_CLAMP, LOG_CLAMP).detach()


def no_correction(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> Correction:
    m = mask.to(learner_lp.dtype)
    return Correction(weights=torch.ones_like(learner_lp), keep=m)


def truncated_is(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, cap: float) -> Correction:
    """Token-level TIS: ``w = min(rho, cap)``; nothing rejected."""
    m = mask.to(learner_lp.dtype)
    rho = _log_ratio(learner_lp, engine_lp, m).exp()
    return Correction(weights=rho.clamp(max=cap) * m + (1 - m), keep=m, capped=(rho > cap).to(m.dtype) * m)


def masked_is(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, low: float, high: float,
              level: str = "token") -> Correction:
    """Masked IS: reject tokens (or whole sequences) whose ratio is outside ``[low, high]``; keep ``w = rho``.

    At ``level="sequence"`` the sequence's ratio is the product of its token ratios (the exact sequence
    importance ratio), and every token of a kept sequence carries it."""
    m = mask.to(learner_lp.dtype)
    log_rho = _log_ratio(learner_lp, engine_lp, m)
    if level == "token":
        rho = log_rho.exp()
        inside = (rho >= low) & (rho <= high)
        keep = m * inside.to(m.dtype)
        return Correction(weights=rho * keep + (1 - keep), keep=keep)
    if level != "sequence":
        raise ValueError(f"masked_is level must be 'token' or 'sequence', not {level!r}")
    seq_rho = log_rho.sum(-1).clamp(-LOG_CLAMP, LOG_CLAMP).exp()  # [B]
    inside = ((seq_rho >= low) & (seq_rho <= high)).to(m.dtype).unsqueeze(-1)
    keep = m * inside
    return Correction(weights=seq_rho.unsqueeze(-1) * keep + (1 - keep), keep=keep)


def geometric_sequence_is(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, cap: float,
                          low: float | None = None, high: float | None = None) -> Correction:
    """Sequence-level IS with the geometric-mean ratio ``exp(mean_t log rho_t)`` (length-independent),
    truncated at ``cap``; with ``low``/``high`` set, sequences whose geometric ratio is outside are rejected."""
    m = mask.to(learner_lp.dtype)
    log_rho = _log_ratio(learner_lp, engine_lp, m)
    geo = (log_rho.sum(-1) / m.sum(-1).clamp(min=1.0)).exp()  # [B]
    inside = torch.ones_like(geo, dtype=torch.bool)
    if low is not None:
        inside &= geo >= low
    if high is not None:
        inside &= geo <= high
    keep = m * inside.to(m.dtype).unsqueeze(-1)
    w = geo.clamp(max=cap).unsqueeze(-1)
    return Correction(weights=w * keep + (1 - keep), keep=keep, capped=(geo > cap).to(m.dtype).unsqueeze(-1) * keep)


def icepop(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, alpha: float,
           beta: float) -> Correction:
    """IcePop: reject tokens whose ratio is outside ``[alpha, beta]`` (both sides), keep ``w = rho``."""
    return masked_is(learner_lp, engine_lp, mask, alpha, beta, level="token")


def mismatch_metrics(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Engine-vs-learner gap over the action tokens, as scalar tensors (no host sync here):
    ``mismatch_k3`` = mean of ``rho - 1 - log rho`` (k3 estimate of KL(engine || learner)), and the mean and
    max absolute log-probability difference."""
    m = mask.to(learner_lp.dtype)
    n = m.sum().clamp(min=1.0)
    log_rho = _log_ratio(learner_lp, engine_lp, m)
    k3 = (log_rho.exp() - 1 - log_rho) * m
    diff = log_rho.abs() * m
    return {"mismatch_k3": k3.sum() / n, "mismatch_abs_mean": diff.sum() / n, "mismatch_abs_max": diff.max()}


CorrectionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Correction]


@runtime_checkable
class CorrectionFunction(Protocol):
    """What a correction kind's implementation is (the base of the correction plug-in point, checked when it
    loads): ``fn(learner_lp, engine_lp, mask, **settings) -> Correction``, ``settings`` its settings' fields
    (``custom``: its ``kwargs``)."""

    def __call__(self, learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor,
                 **settings: Any) -> Correction: ...


def build_correction(settings) -> CorrectionFn:
    """The correction function that ``settings`` (one registered kind's settings, ``algorithm.correction``)
    selects: the kind's function with the settings' fields as keyword arguments (``custom``: the function at
    ``path`` with ``kwargs``), its output checked at every call."""
    if settings.kind not in CORRECTIONS:
        raise ValueError(CORRECTIONS.unknown(settings.kind))
    if isinstance(settings, CustomCorrection):
        fn = load_object(settings.path, CorrectionFunction, what="correction", keywords=settings.kwargs)
        kwargs, what = dict(settings.kwargs), settings.path
    else:  # checked against CorrectionFunction (and its settings' fields) when the point loads it
        fn, kwargs, what = CORRECTIONS.load(settings.kind), kwargs_of(settings), settings.kind

    def call(learner_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> Correction:
        out = fn(learner_lp, engine_lp, mask, **kwargs)
        if not isinstance(out, Correction):
            raise TypeError(f"correction {what} returned {type(out).__name__}, not Correction")
        if out.weights.shape != mask.shape or out.keep.shape != mask.shape:
            raise ValueError(f"correction {what} returned weights {tuple(out.weights.shape)} and keep "
                             f"{tuple(out.keep.shape)}; both must be per token, {tuple(mask.shape)}")
        return out

    return call
