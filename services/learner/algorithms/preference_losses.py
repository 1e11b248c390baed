"""Pairwise preference losses as small pure functions over per-pair tensors.

- :func:`bradley_terry_loss`: reward-model training, ``-log sigmoid(r_chosen - r_rejected - margin)``
  (InstructGPT; OpenRLHF's ``PairWiseLoss``, whose ``margin`` is optional per pair).
- :func:`dpo_loss`: DPO against a reference policy, by ``kind``: ``sigmoid`` (Rafailov et al. 2023), with
  ``label_smoothing`` it is conservative DPO (cDPO: the label is flipped with that probability), and ``ipo``
  (Azar et al. 2023: a squared loss towards a log-ratio gap of ``1 / (2 beta)``).
- :func:`preference_metrics`: the TRL-named metrics of a batch of pairs.

Every loss returns one value per pair (reduce with ``.mean()``); inputs are ``[P]`` tensors on one device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["DPO_LOSSES", "DPOOutput", "bradley_terry_loss", "dpo_loss", "pairwise_accuracy", "preference_metrics"]


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor,
                       margin: torch.Tensor | None = None) -> torch.Tensor:
    """Per-pair ``-log sigmoid(chosen - rejected - margin)`` of scalar rewards (``margin`` 0 when None)."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Fraction of pairs whose chosen side scores strictly higher (a tie counts as wrong)."""
    return (chosen > rejected).float().mean()


@dataclass(frozen=True)
class DPOOutput:
    losses: torch.Tensor  # [P] per-pair loss
    chosen_rewards: torch.Tensor  # [P] beta * (log pi(y_w) - log ref(y_w)), detached
    rejected_rewards: torch.Tensor  # [P] beta * (log pi(y_l) - log ref(y_l)), detached


def _sigmoid(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    # cDPO: with probability eps the preference is flipped; eps = 0 is plain DPO
    return -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)


def _ipo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    return (h - 1.0 / (2.0 * beta)) ** 2


#: DPO loss variants by ``kind``: fn(h, beta, label_smoothing) -> per-pair loss, where h is the log-ratio gap
#: (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))
DPO_LOSSES: dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]] = {"sigmoid": _sigmoid, "ipo": _ipo}


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, kind: str = "sigmoid",
             label_smoothing: float = 0.0) -> DPOOutput:
    """DPO of sequence log-probabilities (summed over each response's tokens) of the policy and the reference."""
    if kind not in DPO_LOSSES:
        raise ValueError(f"unknown DPO loss {kind!r}; known: {sorted(DPO_LOSSES)}")
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    losses = DPO_LOSSES[kind](chosen_ratio - rejected_ratio, beta, label_smoothing)
    return DPOOutput(losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def preference_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """TRL's names: ``rewards/chosen``, ``rewards/rejected`` (means), ``rewards/accuracies`` (chosen > rejected),
    ``rewards/margins`` (mean of chosen - rejected)."""
    chosen, rejected = chosen.detach().float(), rejected.detach().float()
    return {"rewards/chosen": chosen.mean().item(), "rewards/rejected": rejected.mean().item(),
            "rewards/accuracies": pairwise_accuracy(chosen, rejected).item(),
            "rewards/margins": (chosen - rejected).mean().item()}
