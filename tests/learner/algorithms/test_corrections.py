"""Off-policy corrections against hand-computed values (ratio rho = exp(learner_lp - engine_lp))."""

import math

import pytest
import torch

from services.learner.algorithms.correction_settings import (
    GeoSeqCorrection,
    IcePopCorrection,
    MISCorrection,
    NoCorrection,
    TISCorrection,
)
from services.learner.algorithms.corrections import (
    build_correction,
    geometric_sequence_is,
    icepop,
    masked_is,
    mismatch_metrics,
    no_correction,
    truncated_is,
)

# one sequence, rho = [1, 3, 0.25] (+ a padded position that must stay out of everything)
LEARNER = torch.tensor([[0.0, math.log(3.0), math.log(0.25), 7.0]])
ENGINE = torch.zeros(1, 4)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def close(t, values):
    assert torch.allclose(t, torch.tensor(values, dtype=t.dtype), atol=1e-4), t


def test_tis_truncates_each_token_and_rejects_nothing():
    c = truncated_is(LEARNER, ENGINE, MASK, cap=2.0)
    close(c.weights, [[1.0, 2.0, 0.25, 1.0]])
    close(c.keep, [[1.0, 1.0, 1.0, 0.0]])
    stats = c.stats(MASK)
    assert float(stats["is_capped_frac"]) == pytest.approx(1 / 3) and float(stats["is_rejected_frac"]) == 0
    assert float(stats["is_weight_mean"]) == pytest.approx((1 + 2 + 0.25) / 3)


def test_masked_is_token_level_rejects_tokens_outside_the_band():
    c = masked_is(LEARNER, ENGINE, MASK, low=0.5, high=2.0, level="token")
    close(c.keep, [[1.0, 0.0, 0.0, 0.0]])
    assert c.weights[0, 0] == pytest.approx(1.0)
    assert float(c.stats(MASK)["is_rejected_frac"]) == pytest.approx(2 / 3)


def test_masked_is_sequence_level_uses_the_product_ratio():
    # product 1 * 3 * 0.25 = 0.75: inside [0.5, 2]; a second sequence with product 9 is rejected whole
    learner = torch.cat([LEARNER, torch.tensor([[math.log(3.0), math.log(3.0), 0.0, 0.0]])])
    mask = torch.cat([MASK, torch.tensor([[1.0, 1.0, 1.0, 0.0]])])
    c = masked_is(learner, torch.zeros(2, 4), mask, low=0.5, high=2.0, level="sequence")
    close(c.keep, [[1, 1, 1, 0], [0, 0, 0, 0]])
    close(c.weights[0, :3], [0.75, 0.75, 0.75])


def test_geometric_sequence_is_is_length_normalised_and_truncated():
    geo = 0.75 ** (1 / 3)  # exp(mean log rho)
    c = geometric_sequence_is(LEARNER, ENGINE, MASK, cap=2.0)
    close(c.weights[0, :3], [geo] * 3)
    close(c.keep, [[1, 1, 1, 0]])
    assert float(geometric_sequence_is(LEARNER, ENGINE, MASK, cap=0.5).weights[0, 0]) == pytest.approx(0.5)
    rejected = geometric_sequence_is(LEARNER, ENGINE, MASK, cap=2.0, low=0.95)
    close(rejected.keep, [[0, 0, 0, 0]])


def test_icepop_masks_both_sides_and_keeps_the_ratio_inside():
    c = icepop(LEARNER, ENGINE, MASK, alpha=0.5, beta=5.0)
    close(c.keep, [[1.0, 1.0, 0.0, 0.0]])
    close(c.weights[0, :2], [1.0, 3.0])


def test_no_correction():
    c = no_correction(LEARNER, ENGINE, MASK)
    close(c.weights, [[1.0] * 4])
    close(c.keep, MASK.tolist())


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(LEARNER, ENGINE, MASK)
    k3 = [r - 1 - math.log(r) for r in (1.0, 3.0, 0.25)]
    assert float(m["mismatch_k3"]) == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert float(m["mismatch_abs_mean"]) == pytest.approx((math.log(3) + math.log(4)) / 3, rel=1e-5)
    assert float(m["mismatch_abs_max"]) == pytest.approx(math.log(4), rel=1e-5)


@pytest.mark.parametrize("settings,keep", [
    (NoCorrection(), [1, 1, 1, 0]),
    (TISCorrection(cap=2.0), [1, 1, 1, 0]),
    (MISCorrection(low=0.5, high=2.0), [1, 0, 0, 0]),
    (GeoSeqCorrection(cap=2.0), [1, 1, 1, 0]),
    (IcePopCorrection(), [1, 1, 0, 0]),
])
def test_every_kind_is_selectable_by_settings(settings, keep):
    c = build_correction(settings)(LEARNER, ENGINE, MASK)
    close(c.keep, [keep])
    assert not c.weights.requires_grad


def test_settings_refuse_an_empty_band():
    with pytest.raises(ValueError, match="below"):
        MISCorrection(low=2.0, high=0.5)
    with pytest.raises(ValueError, match="below"):
        IcePopCorrection(alpha=5.0, beta=0.5)
