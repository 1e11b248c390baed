"""The pure stages of an RL step against values computed by hand (the arithmetic is in the comments)."""

import math

import pytest
import torch

from services.learner.algorithms.correction_settings import NoCorrection, TISCorrection
from services.learner.algorithms.corrections import build_correction
from services.learner.algorithms.length_shaping_settings import (
    OverlongMask,
    OverlongNone,
    OverlongSoftPenalty,
)
from services.learner.algorithms.normalize import RunningMeanStd
from services.learner.training.batch import build_rl_batch
from services.learner.training.rl_stages import (
    LossMask,
    Pass,
    PreparedBatch,
    UpdateCounts,
    batch_metrics,
    loss_mask,
    step_kl,
    step_scores,
    update_counts,
)
from tests.learner.helpers import group

T = torch.tensor


def close(a, b, tol=1e-6):
    assert torch.allclose(a, T(b, dtype=a.dtype), atol=tol), f"{a.tolist()} != {b}"


# ---- KL ------------------------------------------------------------------------------------------------
OLD = T([[-1.0, -2.0, -3.0]])
REF = T([[-1.5, -2.0, -1.0]])
MASK = T([[1.0, 1.0, 0.0]])


def test_kl_without_a_reference_is_zero():
    kl = step_kl(OLD, None, "k1", MASK)
    assert kl.shape == MASK.shape and kl.tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize(("estimator", "want"), [
    ("k1", [[0.5, 0.0, 0.0]]),  # log ratio old - ref = [0.5, 0, -2]; the padding position masked
    ("k2", [[0.125, 0.0, 0.0]]),  # 0.5**2 / 2
    ("k3", [[math.exp(-0.5) - 1 + 0.5, 0.0, 0.0]]),  # exp(-0.5) - 1 + 0.5
])
def test_kl_by_estimator_over_the_action_tokens(estimator, want):
    close(step_kl(OLD, REF, estimator, MASK), want)


# ---- scores --------------------------------------------------------------------------------------------
RAW = T([1.0, 0.0, 1.0, 0.0])
LENGTHS = T([2, 3, 4, 5])
PENALTY = OverlongSoftPenalty(budget=4, buffer=2, coef=0.5)  # -> 0, -0.25, -0.5, -0.5


def test_scores_without_shaping_normalisation_or_clip_are_the_rewards():
    close(step_scores(RAW, LENGTHS, OverlongNone(), None, None, None), [1.0, 0.0, 1.0, 0.0])
    close(step_scores(RAW, LENGTHS, OverlongMask(), None, None, None), [1.0, 0.0, 1.0, 0.0])


def test_scores_take_the_length_penalty():
    close(step_scores(RAW, LENGTHS, PENALTY, None, None, None), [1.0, -0.25, 0.5, -0.5])


def test_scores_are_normalised_by_the_statistics_of_the_shaped_batch_on_one_rank():
    # shaped [1, -0.25, 0.5, -0.5]: mean 0.75 / 4 = 0.1875; deviations .8125 -.4375 .3125 -.6875,
    # squares .66015625 .19140625 .09765625 .47265625: variance 1.421875 / 4 = 0.35546875
    stats = RunningMeanStd()
    scores = step_scores(RAW, LENGTHS, PENALTY, None, stats, None)
    assert (stats.mean, stats.var, stats.count) == (0.1875, 0.35546875, 4.0)
    sd = math.sqrt(0.35546875 + 1e-8)
    close(scores, [(1 - 0.1875) / sd, (-0.25 - 0.1875) / sd, (0.5 - 0.1875) / sd, (-0.5 - 0.1875) / sd])


def test_scores_are_normalised_by_the_whole_step_batch_on_n_ranks():
    # the step batch's scores [1, 0, 1, 0, 1, 1, 1, 1]: mean 0.75, variance 0.75 * 0.25 = 0.1875
    stats = RunningMeanStd()
    scores = step_scores(RAW, LENGTHS, OverlongNone(), [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], stats, None)
    assert (stats.mean, stats.var, stats.count) == (0.75, 0.1875, 8.0)
    sd = math.sqrt(0.1875 + 1e-8)
    close(scores, [0.25 / sd, -0.75 / sd, 0.25 / sd, -0.75 / sd])


def test_scores_are_clipped_after_normalisation():
    # normalised as above: [0.577, -1.732, 0.577, -1.732] -> clipped to [-1, 1]
    scores = step_scores(RAW, LENGTHS, OverlongNone(), [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0],
                         RunningMeanStd(), 1.0)
    close(scores, [0.25 / math.sqrt(0.1875 + 1e-8), -1.0, 0.25 / math.sqrt(0.1875 + 1e-8), -1.0])
    close(step_scores(T([3.0, -0.5]), T([1, 1]), OverlongNone(), None, None, 2.0), [2.0, -0.5])


# ---- loss mask -----------------------------------------------------------------------------------------
ACTION = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ENGINE = T([[-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0]])
# learner - engine log-probs: ratios 3, 0.5 (then padding) and 1, 1.5, 4
LEARNER = ENGINE + T([[math.log(3.0), math.log(0.5), 0.0], [0.0, math.log(1.5), math.log(4.0)]])
TIS = build_correction(TISCorrection(cap=2.0))


def test_loss_mask_without_overlong_masking_is_the_corrections():
    m = loss_mask(ACTION, T([False, True]), OverlongNone(), TIS, LEARNER, ENGINE)
    close(m.keep, [[1, 1, 0], [1, 1, 1]])
    close(m.weights, [[2.0, 0.5, 1.0], [1.0, 1.5, 2.0]], tol=1e-5)  # min(rho, 2); 1 on padding
    stats = {k: float(v) for k, v in m.stats.items()}
    assert stats["is_rejected_frac"] == 0.0
    assert stats["is_capped_frac"] == pytest.approx(2 / 5)  # ratios 3 and 4 above the cap, of 5 kept
    assert stats["is_weight_mean"] == pytest.approx((2 + 0.5 + 1 + 1.5 + 2) / 5)
    assert stats["mismatch_abs_mean"] == pytest.approx(
        (math.log(3) + math.log(2) + 0 + math.log(1.5) + math.log(4)) / 5, rel=1e-5)


def test_loss_mask_drops_truncated_samples_before_the_correction():
    # the second sample was cut by length: out of the loss; the correction weighs only the first's tokens
    m = loss_mask(ACTION, T([False, True]), OverlongMask(), TIS, LEARNER, ENGINE)
    close(m.keep, [[1, 1, 0], [0, 0, 0]])
    close(m.weights, [[2.0, 0.5, 1.0], [1.0, 1.0, 1.0]], tol=1e-5)
    stats = {k: float(v) for k, v in m.stats.items()}
    assert stats["is_rejected_frac"] == pytest.approx(3 / 5)  # over all 5 action tokens
    assert stats["is_capped_frac"] == pytest.approx(1 / 2)  # ratio 3, of the 2 kept
    assert stats["is_weight_mean"] == pytest.approx((2 + 0.5) / 2)
    # the engine / learner gap is measured over every action token, kept or not
    assert stats["mismatch_abs_mean"] == pytest.approx(
        (math.log(3) + math.log(2) + 0 + math.log(1.5) + math.log(4)) / 5, rel=1e-5)


def test_loss_mask_without_correction_keeps_the_action_tokens_at_weight_one():
    m = loss_mask(ACTION, T([False, False]), OverlongSoftPenalty(budget=4, buffer=2), build_correction(NoCorrection()),
                  LEARNER, ENGINE)
    close(m.keep, [[1, 1, 0], [1, 1, 1]])
    close(m.weights, [[1, 1, 1], [1, 1, 1]])


# ---- update counts -------------------------------------------------------------------------------------
KEEP = T([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
ACTIONS = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_update_counts_of_a_mini_batch():
    # rows 0 and 1: kept tokens 2 + 0, sequences with a kept token 1, action tokens 2 + 3, samples 2
    c = update_counts(KEEP, ACTIONS, T([0, 1]))
    assert (float(c.tokens), c.sequences, float(c.action_tokens), c.samples) == (2.0, 1.0, 5.0, 2.0)
    assert c.tokens.dtype == KEEP.dtype


def test_update_counts_never_divide_by_zero_tokens():
    c = update_counts(KEEP, ACTIONS, T([1]))  # nothing kept: the token denominator is 1, the sequence count 0
    assert (float(c.tokens), c.sequences, float(c.action_tokens), c.samples) == (1.0, 0.0, 3.0, 1.0)


# ---- a pass's rows -------------------------------------------------------------------------------------
def _batch(lengths, rewards, finish=None):
    exps = group("p", [[100] * n for n in lengths], rewards)
    if finish:
        exps = [e.model_copy(update={"finish_reason": f}) for e, f in zip(exps, finish)]
    return build_rl_batch(exps, pad_id=0)


def test_a_pass_cuts_full_batch_tensors_to_its_rows_and_width():
    batch = _batch([2, 1, 3], [0.0, 0.0, 0.0])
    rows = T([1, 0])
    one = Pass(batch=batch.select(rows), rows=rows, counts=UpdateCounts(T(1.0), 1.0, T(1.0), 1.0))
    full = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    assert one.batch.action_mask.shape[1] == 2  # the longest response of rows 1 and 0
    assert one.cols(full).tolist() == [[4.0, 5.0], [1.0, 2.0]]


# ---- metrics -------------------------------------------------------------------------------------------
def test_batch_metrics_by_hand():
    batch = _batch([2, 1], [1.0, 0.0], finish=["stop", "length"])  # action mask [[1, 1], [1, 0]]
    adv = T([[1.0, 3.0], [2.0, 9.0]])  # over the action tokens: mean (1 + 3 + 2) / 3 = 2, variance 2 / 3
    returns = T([[0.0, 3.0], [3.0, 100.0]])  # mean 2
    mask = LossMask(keep=batch.action_mask, weights=torch.ones(2, 2), stats={"is_rejected_frac": T(0.25)})
    prepared = PreparedBatch(old_logprobs=torch.zeros(2, 2), reference_logprobs=None, values=None,
                             kl=T([[7.0, 7.0], [7.0, 7.0]]), scores=T([0.5, -1.5]))
    m = batch_metrics(batch, prepared, adv, returns, mask)
    assert list(m) == ["reward_mean", "reward_std", "score_mean", "kl", "advantage_mean", "advantage_std",
                       "return_mean", "is_rejected_frac", "truncated_frac", "response_len_mean"]
    assert m["reward_mean"] == 0.5 and m["reward_std"] == 0.5 and m["score_mean"] == -0.5
    assert m["kl"] == 0.0  # no reference: no KL, whatever the tensor holds
    assert m["advantage_mean"] == pytest.approx(2.0) and m["advantage_std"] == pytest.approx(math.sqrt(2 / 3))
    assert m["return_mean"] == pytest.approx(2.0) and m["is_rejected_frac"] == 0.25
    assert m["truncated_frac"] == 0.5 and m["response_len_mean"] == 1.5
    with_ref = PreparedBatch(old_logprobs=torch.zeros(2, 2), reference_logprobs=torch.zeros(2, 2), values=None,
                             kl=T([[1.0, 2.0], [6.0, 100.0]]), scores=T([0.5, -1.5]))
    assert batch_metrics(batch, with_ref, adv, returns, mask)["kl"] == pytest.approx(3.0)  # (1 + 2 + 6) / 3
