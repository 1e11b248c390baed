"""KL estimators, policy / value losses, entropy and aggregation against hand-computed values (TIS: test_corrections)."""

import math

import pytest
import torch

from services.learner.algorithms.kl import KL_ESTIMATORS, kl_estimate
from services.learner.algorithms.loss_terms import (
    aggregate,
    clipped_surrogate,
    entropy_from_logits,
    value_loss,
)
from services.learner.algorithms.masked import masked_mean, masked_whiten
from services.learner.algorithms.normalize import RunningMeanStd

T = torch.tensor
LN = math.log


def close(a, b, tol=1e-5):
    assert torch.allclose(a, T(b, dtype=a.dtype), atol=tol), f"{a.tolist()} != {b}"


@pytest.mark.parametrize(
    ("name", "expected"),
    # log_ratio = ln(.5) - ln(.25) = ln 2 = .693147
    [("k1", 0.693147), ("k2", 0.693147**2 / 2), ("k3", 0.5 - 1 + 0.693147)],
)
def test_kl_estimators(name, expected):
    out = KL_ESTIMATORS[name](T([LN(0.5)]), T([LN(0.25)]))
    close(out, [expected])


def test_kl_estimate_masks_and_nonnegative_k2_k3():
    torch.manual_seed(0)
    lp, ref = torch.randn(3, 5), torch.randn(3, 5)
    mask = T([[1, 1, 0, 0, 0]] * 3)
    for name in ("k2", "k3"):
        kl = kl_estimate(lp, ref, name, mask)
        assert (kl >= 0).all() and (kl[:, 2:] == 0).all()


def test_clipped_surrogate_clip_higher():
    # ratio, adv -> loss: (1.5,+1): min(1.5, 1.28)=1.28 clipped ; (.5,+1): min(.5,.8)=.5 ;
    # (.5,-1): min(-.5,-.8)=-.8 clipped ; (1.5,-1): min(-1.5,-1.28)=-1.5 ; (1.25,+1): 1.25 < 1.28 unclipped
    ratios = T([1.5, 0.5, 0.5, 1.5, 1.25])
    adv = T([1.0, 1.0, -1.0, -1.0, 1.0])
    out = clipped_surrogate(ratios.log(), torch.zeros(5), adv, eps_low=0.2, eps_high=0.28)
    close(out.loss, [-1.28, -0.5, 0.8, 1.5, -1.25])
    close(out.clipped, [1, 0, 1, 0, 0])
    close(out.ratio, ratios.tolist())
    symmetric = clipped_surrogate(ratios.log(), torch.zeros(5), adv, eps_low=0.2, eps_high=0.2)
    close(symmetric.loss[4:], [-1.2])


def test_dual_clip_caps_negative_advantage_loss():
    # ratio 5, adv -1: clip1 = min(-5, -1.2) = -5 ; dual c=3: max(-5, -3) = -3 -> loss 3
    # ratio 1.5, adv -1: clip1 = -1.5 ; max(-1.5, -3) = -1.5 -> 1.5 ; positive adv untouched
    out = clipped_surrogate(T([5.0, 1.5, 5.0]).log(), torch.zeros(3), T([-1.0, -1.0, 1.0]), dual_clip=3.0)
    close(out.loss, [3.0, 1.5, -1.2])
    close(out.clipped, [1, 0, 1])


def test_value_loss_clipped():
    # V=1.5, V_old=1, R=2: V_clip=1.2 -> max(.64, .25)/2 = .32 ; V=.5, V_old=1, R=0: V_clip=.8 -> max(.64,.25)/2=.32
    v, old, ret = T([1.5, 0.5]), T([1.0, 1.0]), T([2.0, 0.0])
    close(value_loss(v, old, ret, clip_eps=0.2), [0.32, 0.32])
    close(value_loss(v, old, ret, clip_eps=None), [0.125, 0.125])


def test_entropy_from_logits():
    close(entropy_from_logits(torch.zeros(1, 4)), [LN(4)])
    close(entropy_from_logits(T([[LN(0.75), LN(0.25)]])), [-(0.75 * LN(0.75) + 0.25 * LN(0.25))])


def test_aggregation_modes():
    loss = T([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = T([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregation_micro_batches_add_up(mode):
    torch.manual_seed(1)
    loss = torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[:, 0] = 1
    whole = aggregate(loss, mask, mode)
    parts = sum(
        aggregate(loss[i : i + 2], mask[i : i + 2], mode, num_tokens=mask.sum(), num_seqs=4) for i in (0, 2)
    )
    assert parts.item() == pytest.approx(whole.item(), abs=1e-6)


def test_masked_mean_and_whiten():
    x, mask = T([1.0, 2.0, 3.0, 100.0]), T([1, 1, 1, 0])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    # mean 2, population var 2/3 -> (x-2)/sqrt(2/3)
    close(masked_whiten(x, mask), [-1.224745, 0.0, 1.224745, 0.0])


def test_running_mean_std():
    rms = RunningMeanStd()
    rms.update(T([1.0, 2.0, 3.0]))
    rms.update(T([4.0, 5.0]))
    # all five: mean 3, population var (4+1+0+1+4)/5 = 2
    assert rms.mean == pytest.approx(3.0) and rms.var == pytest.approx(2.0) and rms.count == 5
    close(rms.normalize(T([3.0 + 2**0.5])), [1.0], tol=1e-4)
    restored = RunningMeanStd()
    restored.load_state_dict(rms.state_dict())
    assert restored == rms
