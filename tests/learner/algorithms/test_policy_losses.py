"""Policy losses against hand-computed values and gradients."""

import math

import pytest
import torch

from services.learner.algorithms.policy_loss_settings import (
    CISPOLoss,
    CustomLoss,
    DPPOLoss,
    DrGRPOLoss,
    GSPOLoss,
    PPOClipLoss,
)
from services.learner.algorithms.policy_losses import (
    PolicyLossInputs,
    build_policy_loss,
    cispo_loss,
    dppo_loss,
    dr_grpo_loss,
    gspo_loss,
    ppo_loss,
)


def inputs(logp, old, adv, mask=None, weights=None):
    logp = torch.tensor([logp], requires_grad=True)
    old = torch.tensor([old])
    adv = torch.tensor([adv])
    mask = torch.ones_like(old) if mask is None else torch.tensor([mask])
    w = torch.ones_like(old) if weights is None else torch.tensor([weights])
    return PolicyLossInputs(logp=logp, old_logp=old, advantages=adv, mask=mask, weights=w), logp


def test_ppo_clips_and_applies_weights_and_mask():
    # ratios e^0.5 = 1.6487 (clipped at 1.2 for A > 0) and e^-0.1 = 0.9048 (inside)
    x, logp = inputs([0.5, -0.1, 0.3], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], mask=[1, 1, 0], weights=[2.0, 0.5, 1.0])
    out = ppo_loss(x, eps_low=0.2, eps_high=0.2)
    assert out.loss.tolist()[0] == pytest.approx([-1.2 * 2.0, -math.exp(-0.1) * 0.5, 0.0], rel=1e-5)
    assert out.clipped.tolist()[0] == [1.0, 0.0, 0.0]
    out.loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -math.exp(-0.1) * 0.5, 0.0], rel=1e-5)


def test_dr_grpo_divides_by_a_constant_and_sums_tokens():
    x, _ = inputs([0.0, 0.0], [0.0, 0.0], [1.0, 1.0])
    out = dr_grpo_loss(x, 0.2, 0.2, normalizer=4)
    assert out.loss.tolist()[0] == pytest.approx([-0.25, -0.25])
    assert DrGRPOLoss().aggregation == "seq-mean-token-sum"


def test_gspo_uses_one_sequence_ratio_for_every_token():
    # mean log ratio (0.1 + 0.3) / 2 = 0.2 -> s = e^0.2 = 1.2214; A > 0 clipped at 1.1, A < 0 not
    x, logp = inputs([0.1, 0.3], [0.0, 0.0], [1.0, 1.0])
    out = gspo_loss(x, eps_low=0.1, eps_high=0.1)
    assert out.loss.tolist()[0] == pytest.approx([-1.1, -1.1], rel=1e-5)
    assert out.ratio.tolist()[0] == pytest.approx([math.exp(0.2)] * 2, rel=1e-5)
    assert out.clipped.tolist()[0] == [1.0, 1.0]
    out.loss.sum().backward()
    assert logp.grad.abs().sum() == 0  # the clipped branch carries no gradient
    x, logp = inputs([0.1, 0.3], [0.0, 0.0], [-1.0, -1.0])
    out = gspo_loss(x, eps_low=0.1, eps_high=0.1)
    assert out.loss.tolist()[0] == pytest.approx([math.exp(0.2)] * 2, rel=1e-5)
    out.loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([math.exp(0.2)] * 2, rel=1e-5)  # d/dlogp_t = -A * s
    assert GSPOLoss().aggregation == "seq-mean-token-mean"


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    # ratio e^0.5 = 1.6487 -> weight 1.28 (stop-gradient); loss = -1.28 * A * logp
    x, logp = inputs([-0.5], [-1.0], [2.0])
    out = cispo_loss(x, eps_low=1.0, eps_high=0.28)
    assert out.loss.item() == pytest.approx(-1.28 * 2.0 * -0.5, rel=1e-5)
    assert out.clipped.item() == 1.0
    out.loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-1.28 * 2.0, rel=1e-5)


def test_dppo_drops_tokens_that_moved_too_far_in_the_advantage_direction():
    # probability 0.3 -> 0.6 (+0.3 > 0.2): dropped for A > 0, trained for A < 0 (loss = -A * ratio = 2)
    x, logp = inputs([math.log(0.6), math.log(0.6)], [math.log(0.3), math.log(0.3)], [1.0, -1.0])
    out = dppo_loss(x, delta_low=0.2, delta_high=0.2)
    assert out.clipped.tolist()[0] == [1.0, 0.0]
    assert out.loss.tolist()[0] == pytest.approx([0.0, 2.0], rel=1e-5)
    out.loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 2.0], rel=1e-5)  # d(-A r)/dlogp = -A r


@pytest.mark.parametrize("settings", [PPOClipLoss(), DrGRPOLoss(), GSPOLoss(), CISPOLoss(), DPPOLoss()])
def test_every_loss_is_selectable_and_descends_for_a_rewarded_token(settings):
    x, logp = inputs([-1.0, -1.0], [-1.0, -1.0], [1.0, -1.0])
    out = build_policy_loss(settings)(x)
    assert out.loss.shape == logp.shape
    out.loss.sum().backward()
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1]  # descending raises the rewarded token's log-prob


def test_a_custom_loss_may_return_what_clipped_surrogate_returns():
    # there was a second PolicyLossOutput class in losses.py: a custom loss built on clipped_surrogate failed the check
    x, _ = inputs([-1.0, -0.5], [-1.0, -1.0], [1.0, 1.0])
    out = build_policy_loss(CustomLoss(path="tests.learner.training.custom_loss:surrogate_as_is"))(x)
    assert out.loss.tolist()[0] == pytest.approx([-1.0, -1.2])  # ratio 1 and e^0.5 clipped at 1.2
