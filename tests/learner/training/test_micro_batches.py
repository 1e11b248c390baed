"""Micro-batches by count and by token budget."""

import random

import pytest

from services.learner.training.micro_batches import by_count, by_token_budget


def padded_tokens(lengths, groups) -> int:
    """Token slots the forward passes compute over (real tokens plus padding)."""
    return sum(len(g) * max(lengths[i] for i in g) for g in groups if g)


def test_by_count_slices_in_order():
    assert by_count(5, 2) == [[0, 1], [2, 3], [4]]


def test_token_budget_packs_sorted_rows_within_the_budget():
    lengths = [100, 10, 12, 90, 11, 13]
    groups = by_token_budget(lengths, budget=200)
    assert groups == [[0, 3], [5, 2, 4, 1]]  # 2 x 100 = 200; 4 x 13 = 52
    assert all(len(g) * max(lengths[i] for i in g) <= 200 for g in groups)


def test_a_row_over_the_budget_is_alone_and_max_rows_caps_a_pass():
    assert by_token_budget([500, 20, 20], budget=100) == [[0], [1, 2]]
    assert by_token_budget([5] * 5, budget=1000, max_rows=2) == [[0, 1], [2, 3], [4]]


def test_every_row_exactly_once_and_less_padding_than_by_count_on_skewed_lengths():
    rng = random.Random(0)
    lengths = [rng.choice([16, 32, 64, 1024]) for _ in range(64)]
    groups = by_token_budget(lengths, budget=4096)
    assert sorted(i for g in groups for i in g) == list(range(64))
    assert padded_tokens(lengths, groups) < 1.15 * sum(lengths)  # almost no padding
    assert padded_tokens(lengths, groups) < 0.6 * padded_tokens(lengths, by_count(64, 4))


def test_budget_must_be_positive():
    with pytest.raises(ValueError):
        by_token_budget([1], 0)
