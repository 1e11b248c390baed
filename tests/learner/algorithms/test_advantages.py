"""Advantage estimators against values computed by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from services.learner.algorithms.advantages import (
    discounted_returns,
    end_token_rewards,
    gae,
    group_advantages,
    rloo_advantages,
)

T = torch.tensor


def close(a, b, tol=1e-5):
    assert torch.allclose(a, T(b, dtype=a.dtype), atol=tol), f"{a.tolist()} != {b}"


def test_gae_full_mask():
    # gamma=1, lambda=0.5, V=[.5,.6,.7], r=[0,0,1]
    # t2: delta=1-.7=.3 -> A=.3 ; t1: delta=.7-.6=.1 -> A=.1+.5*.3=.25 ; t0: delta=.1 -> A=.1+.5*.25=.225
    adv, ret = gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1.0, 1.0, 1.0]]), gamma=1.0, lambd=0.5)
    close(adv, [[0.225, 0.25, 0.3]])
    close(ret, [[0.725, 0.85, 1.0]])


def test_gae_right_padding_ignores_padding_values():
    # mask [1,1,0]: padded V=5 must not leak. t1: delta=1-.6=.4 ; t0: delta=.6-.5=.1 -> A=.1+.5*.4=.3
    adv, ret = gae(T([[0.0, 1.0, 0.0]]), T([[0.5, 0.6, 5.0]]), T([[1.0, 1.0, 0.0]]), gamma=1.0, lambd=0.5)
    close(adv, [[0.3, 0.4, 0.0]])
    close(ret, [[0.8, 1.0, 0.0]])


def test_gae_mask_hole_is_skipped():
    # mask [1,0,1] (e.g. a tool-output token): position 1 is skipped, its reward 9 and value 9 ignored.
    # t2: A=.3 ; t0: delta = 0 + V2 - V0 = .7-.5 = .2 -> A = .2 + .5*.3 = .35
    adv, ret = gae(T([[0.0, 9.0, 1.0]]), T([[0.5, 9.0, 0.7]]), T([[1.0, 0.0, 1.0]]), gamma=1.0, lambd=0.5)
    close(adv, [[0.35, 0.0, 0.3]])
    close(ret, [[0.85, 0.0, 1.0]])


def test_gae_lambda_one_is_discounted_return_minus_value():
    # gamma=.9, lambda=1: G=[.81,.9,1] so A=G-V=[.31,.3,.3]
    adv, _ = gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1.0, 1.0, 1.0]]), gamma=0.9, lambd=1.0)
    close(adv, [[0.31, 0.3, 0.3]])


def test_discounted_returns():
    # gamma=.5: G2=3, G1=2+.5*3=3.5, G0=1+.5*3.5=2.75 ; second row padded after 2 tokens
    ret = discounted_returns(T([[1.0, 2.0, 3.0], [1.0, 1.0, 7.0]]), T([[1, 1, 1], [1, 1, 0]]), gamma=0.5)
    close(ret, [[2.75, 3.5, 3.0], [1.5, 1.0, 0.0]])


def test_end_token_rewards():
    mask = T([[1, 1, 0], [1, 1, 1], [0, 0, 0], [0, 1, 0]])
    out = end_token_rewards(T([2.0, 3.0, 5.0, 7.0]), mask)
    close(out, [[0, 2, 0], [0, 0, 3], [0, 0, 0], [0, 7, 0]])


def test_group_advantages_with_std():
    # group 7: r=[1,0,0,1], mean .5, unbiased std sqrt((4*.25)/3)=.57735 -> +-.5/.57735=+-.866025
    # group 3: r=[2,2] -> centred 0, std 0 -> 0
    adv = group_advantages(T([1.0, 0.0, 0.0, 1.0, 2.0, 2.0]), T([7, 7, 7, 7, 3, 3]), norm_std=True, eps=1e-9)
    close(adv, [0.866025, -0.866025, -0.866025, 0.866025, 0.0, 0.0])


def test_group_advantages_without_std():
    adv = group_advantages(T([1.0, 0.0, 0.0, 1.0, 2.0, 4.0]), T([7, 7, 7, 7, 3, 3]), norm_std=False)
    close(adv, [0.5, -0.5, -0.5, 0.5, -1.0, 1.0])


def test_group_of_one_is_zero():
    assert group_advantages(T([3.0]), T([0]))[0].item() == 0.0
    assert rloo_advantages(T([3.0]), T([0]))[0].item() == 0.0


def test_rloo():
    # sum=12, baseline_i=(12-r_i)/3 = [11/3, 10/3, 3, 2] ; adv = r - baseline
    adv = rloo_advantages(T([1.0, 2.0, 3.0, 6.0]), T([0, 0, 0, 0]))
    close(adv, [1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0])


@pytest.mark.parametrize("norm_std", [True, False])
def test_group_advantages_sum_to_zero_per_group(norm_std):
    torch.manual_seed(0)
    scores = torch.randn(12)
    groups = torch.arange(12) // 4
    adv = group_advantages(scores, groups, norm_std=norm_std)
    for g in range(3):
        assert math.isclose(adv[groups == g].sum().item(), 0.0, abs_tol=1e-5)
