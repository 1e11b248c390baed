"""Overlong handling against hand values: the tensor functions, and each kind's methods the trainer calls."""

import subprocess
import sys
import typing

import pytest
import torch

from services.learner.algorithms.length_shaping import keep_unless_truncated, soft_overlong_penalty
from services.learner.algorithms.length_shaping_settings import (
    OverlongMask,
    OverlongNone,
    OverlongSettings,
    OverlongSoftPenalty,
)
from tests.procs import REPO


def test_soft_overlong_penalty_by_hand():
    # budget 100, buffer 20: free up to 80, then (80 - n) / 20, -1 past 100
    lengths = torch.tensor([10, 80, 85, 90, 100, 101, 500])
    assert soft_overlong_penalty(lengths, 100, 20).tolist() == pytest.approx([0, 0, -0.25, -0.5, -1.0, -1.0, -1.0])


def test_truncated_samples_are_masked():
    assert keep_unless_truncated(torch.tensor([False, True, False])).tolist() == [1.0, 0.0, 1.0]


def test_the_buffer_must_fit_the_budget():
    with pytest.raises(ValueError):
        soft_overlong_penalty(torch.tensor([1]), 10, 20)
    with pytest.raises(ValueError, match="exceed"):
        OverlongSoftPenalty(budget=10, buffer=20)


SCORES = torch.tensor([1.0, 0.0, 1.0, 0.0])
LENGTHS = torch.tensor([2, 3, 4, 5])
TRUNCATED = torch.tensor([False, False, True, True])


def test_none_leaves_scores_and_loss_alone():
    o = OverlongNone()
    assert o.shape_scores(SCORES, LENGTHS).tolist() == [1.0, 0.0, 1.0, 0.0]
    keep = o.loss_keep(TRUNCATED)
    assert keep.dtype == torch.float32 and keep.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_mask_takes_truncated_samples_out_of_the_loss_and_leaves_scores():
    o = OverlongMask()
    assert o.shape_scores(SCORES, LENGTHS).tolist() == [1.0, 0.0, 1.0, 0.0]
    keep = o.loss_keep(TRUNCATED)
    assert keep.dtype == torch.float32 and keep.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_soft_penalty_shapes_scores_and_keeps_every_sample():
    # budget 4, buffer 2: free up to 2 tokens; 3 -> (2 - 3) / 2 = -0.5; 4 -> -1; 5 -> -1; times coef 0.5
    o = OverlongSoftPenalty(budget=4, buffer=2, coef=0.5)
    assert o.shape_scores(SCORES, LENGTHS).tolist() == pytest.approx([1.0, -0.25, 0.5, -0.5])
    assert o.loss_keep(TRUNCATED).tolist() == [1.0, 1.0, 1.0, 1.0]


def test_every_kind_is_tested_here():
    """A new kind needs its own test above (and its own methods where it does something)."""
    union = typing.get_args(OverlongSettings)[0]
    assert {cls.model_fields["kind"].default for cls in typing.get_args(union)} == {"none", "mask", "soft_penalty"}


@pytest.mark.process
def test_the_settings_import_without_torch():
    probe = ("import sys; import services.learner.algorithms.algorithm_settings; "
             "assert 'torch' not in sys.modules, 'the algorithm settings imported torch'")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
