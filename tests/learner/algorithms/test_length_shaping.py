"""Overlong handling against hand values."""

import pytest
import torch

from services.learner.algorithms.length_shaping import keep_unless_truncated, soft_overlong_penalty
from services.learner.algorithms.length_shaping_settings import OverlongSoftPenalty


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
