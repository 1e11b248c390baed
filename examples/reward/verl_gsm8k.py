"""A verl-style reward function: ``compute_score(data_source, solution_str, ground_truth, extra_info)``."""

from __future__ import annotations

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 when the number after the last ``####`` (else the last number) equals the ground truth."""
    tail = solution_str.rsplit("####", 1)[-1]
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", tail)
    if not numbers:
        return {"score": 0.0, "found_answer": False}
    answer = numbers[-1].replace(",", "").rstrip(".")
    expected = str(ground_truth).replace(",", "").strip()
    try:
        correct = float(answer) == float(expected)
    except ValueError:
        correct = answer == expected
    return {"score": 1.0 if correct else 0.0, "found_answer": True}
