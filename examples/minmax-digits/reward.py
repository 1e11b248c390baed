"""The minmax-digits reward, a verl ``compute_score`` in a file beside the spec (a ``python`` scorer).

1.0 when the answer is exactly the smallest then the largest digit (surrounding whitespace ignored), else 0.0: the
held-out accuracy is the share of prompts answered exactly.
"""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth).strip())
