"""Online preference selection: pairs from groups (ties, no gap, equal scores) and best-of-n above a threshold."""

from services.learner.algorithms.pair_selection import (
    Pick,
    best_above,
    best_and_worst,
    dpo_picks,
    rejection_picks,
)
from services.learner.rl.group_buffer import zero_variance


def test_best_and_worst_picks_the_extremes():
    assert best_and_worst([0.2, 1.0, -0.5, 0.3], min_gap=0.5) == (1, 2)


def test_ties_break_by_position_first_of_each():
    # two at the top (1, 3), two at the bottom (0, 2): the first of each
    assert best_and_worst([0.0, 1.0, 0.0, 1.0], min_gap=1.0) == (1, 0)


def test_no_pair_without_the_gap():
    assert best_and_worst([0.0, 0.4, 0.2], min_gap=0.5) is None
    assert best_and_worst([1.0, 1.0, 1.0], min_gap=1e-9) is None  # all equal: what dynamic sampling drops
    assert best_and_worst([1.0], min_gap=0.1) is None
    assert best_and_worst([0.0, 0.5], min_gap=0.5) == (1, 0)  # exactly the gap is enough


def test_dpo_picks_skip_groups_without_a_pair():
    picks = dpo_picks([[0.0, 1.0], [1.0, 1.0], [0.3, 0.0, 0.9]], min_gap=0.5)
    assert picks == [Pick(0, 1, 0, 1.0), Pick(2, 2, 1, 0.9)]


def test_best_above_threshold():
    assert best_above([0.2, 0.9, 0.9], threshold=0.5) == 1
    assert best_above([0.2, 0.4], threshold=0.5) is None
    assert best_above([0.5], threshold=0.5) == 0
    assert best_above([], threshold=0.0) is None
    assert rejection_picks([[0.0, 1.0], [0.0, 0.0], [1.0, 0.2]], threshold=1.0) == [Pick(0, 1, None, 1.0),
                                                                                       Pick(2, 0, None, 1.0)]


def test_groups_dynamic_sampling_drops_hold_no_pair_and_the_others_do():
    # dynamic sampling drops exactly the zero-variance groups; with any min_gap those hold no pair, and every other
    # group holds one once min_gap is at most its spread
    groups = [[1.0, 1.0, 1.0], [0.0, 0.0], [0.0, 1.0, 0.0], [0.25, 0.5]]
    for scores in groups:
        spread = max(scores) - min(scores)
        assert zero_variance(scores) == (best_and_worst(scores, min_gap=1e-6) is None)
        if spread:
            assert best_and_worst(scores, min_gap=spread) is not None
            assert best_and_worst(scores, min_gap=spread + 1e-6) is None
