"""Preference losses against values computed by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from services.learner.algorithms.preference_losses import (
    bradley_terry_loss,
    dpo_loss,
    pairwise_accuracy,
    preference_metrics,
)

T = torch.tensor


def close(a, b, tol=1e-5):
    assert torch.allclose(a, T(b, dtype=a.dtype), atol=tol), f"{a.tolist()} != {b}"


def softplus(x):
    return math.log1p(math.exp(x))


def test_bradley_terry_no_margin():
    # diff = [1, 0, -2]; -log sigmoid(d) = softplus(-d) = [log(1+e^-1), log 2, log(1+e^2)]
    out = bradley_terry_loss(T([2.0, 0.5, -1.0]), T([1.0, 0.5, 1.0]))
    close(out, [softplus(-1.0), math.log(2.0), softplus(2.0)])


def test_bradley_terry_margin_shifts_the_gap():
    # diff 1 with margin 1 -> 0 -> log 2; diff 1 with margin -1 -> 2 -> softplus(-2)
    out = bradley_terry_loss(T([2.0, 2.0]), T([1.0, 1.0]), margin=T([1.0, -1.0]))
    close(out, [math.log(2.0), softplus(-2.0)])


def test_bradley_terry_gradient_pushes_chosen_up():
    chosen = T([0.0], requires_grad=True)
    bradley_terry_loss(chosen, T([0.0])).sum().backward()
    assert chosen.grad.item() == pytest.approx(-0.5)  # d/dc softplus(r - c) = -sigmoid(r - c) = -0.5


def test_dpo_sigmoid():
    # policy (chosen, rejected) = (-1, -3), ref = (-2, -2): chosen ratio 1, rejected ratio -1, h = 2;
    # beta .5: loss = -log sigmoid(1) = softplus(-1); rewards .5 and -.5
    out = dpo_loss(T([-1.0]), T([-3.0]), T([-2.0]), T([-2.0]), beta=0.5)
    close(out.losses, [softplus(-1.0)])
    close(out.chosen_rewards, [0.5])
    close(out.rejected_rewards, [-0.5])


def test_dpo_equal_to_reference_is_log2():
    out = dpo_loss(T([-4.0, -1.0]), T([-2.0, -5.0]), T([-4.0, -1.0]), T([-2.0, -5.0]), beta=0.1)
    close(out.losses, [math.log(2.0)] * 2)


def test_cdpo_label_smoothing():
    # h = 2, beta .5 -> beta*h = 1; eps .25: .75 * softplus(-1) + .25 * softplus(1)
    out = dpo_loss(T([-1.0]), T([-3.0]), T([-2.0]), T([-2.0]), beta=0.5, label_smoothing=0.25)
    close(out.losses, [0.75 * softplus(-1.0) + 0.25 * softplus(1.0)])


def test_ipo():
    # h = 2, beta .5 -> target 1/(2*.5) = 1: (2 - 1)^2 = 1; h = 0 -> 1
    out = dpo_loss(T([-1.0, -2.0]), T([-3.0, -2.0]), T([-2.0, -2.0]), T([-2.0, -2.0]), beta=0.5, kind="ipo")
    close(out.losses, [1.0, 1.0])
    # h = 1 -> 0
    close(dpo_loss(T([-1.0]), T([-2.0]), T([-1.0]), T([-1.0]), beta=0.5, kind="ipo").losses, [0.0])


def test_dpo_unknown_kind():
    with pytest.raises(ValueError, match="known"):
        dpo_loss(T([0.0]), T([0.0]), T([0.0]), T([0.0]), beta=0.1, kind="hinge2")


def test_metrics_trl_names():
    # chosen [1, 0, 2], rejected [0, 0, 3]: accuracies 1/3 (a tie is wrong), margins (1 + 0 - 1)/3 = 0
    m = preference_metrics(T([1.0, 0.0, 2.0]), T([0.0, 0.0, 3.0]))
    assert m["rewards/chosen"] == pytest.approx(1.0)
    assert m["rewards/rejected"] == pytest.approx(1.0)
    assert m["rewards/accuracies"] == pytest.approx(1 / 3)
    assert m["rewards/margins"] == pytest.approx(0.0)
    assert pairwise_accuracy(T([1.0]), T([1.0])).item() == 0.0
