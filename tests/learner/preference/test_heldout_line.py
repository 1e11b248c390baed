"""The closing line of a preference run, from its held-out points."""

from services.learner.preference.runner import heldout_line


def test_line_from_first_and_last_point():
    points = [{"step": 0, "accuracy": 0.47, "margin": -0.001, "pairs": 200},
              {"step": 10, "accuracy": 0.8, "margin": 0.3, "pairs": 200},
              {"step": 30, "accuracy": 0.99, "margin": 3.761, "pairs": 200}]
    assert heldout_line(points) == ("held-out pairwise accuracy: 47.0% (start) -> 99.0% (end)   mean margin -0.001 -> "
                                    "3.761   (200 pairs, steps 0 -> 30)")
    assert heldout_line(points[:1]) is None and heldout_line([]) is None
