"""A user's own policy loss, loaded by import path (algorithm.policy_loss: {kind: custom, path: ...})."""

from services.learner.algorithms.loss_terms import clipped_surrogate
from services.learner.algorithms.policy_losses import PolicyLossInputs, PolicyLossOutput


def plain_reinforce(x: PolicyLossInputs, scale: float = 1.0) -> PolicyLossOutput:
    """-A * log pi, weighted and masked: no ratio, nothing clipped."""
    loss = -scale * x.advantages * x.logp * x.weights * x.mask
    return PolicyLossOutput(loss=loss, ratio=(x.logp - x.old_logp).exp().detach(), clipped=x.mask * 0.0)


def surrogate_as_is(x: PolicyLossInputs):
    """Returns what ``clipped_surrogate`` returns, unwrapped."""
    return clipped_surrogate(x.logp, x.old_logp, x.advantages)
