"""Reward for reasoning-gym tasks: the dataset's own ``score_answer``, called through the reward service's
``python`` scorer with verl's signature (``compute_score(data_source, solution_str, ground_truth, extra_info)``).

``ground_truth`` is the row's label as ``prepare.py`` writes it: ``{"dataset": name, "entry": {...}}``, the
generator's whole entry (question, answer, metadata), so any dataset's ``score_answer`` gets what it reads.
The model's answer is the text inside ``<answer>...</answer>`` when it writes that (reasoning-gym's
convention), else its last non-empty line.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=64)
def _scorer(name: str):
    import reasoning_gym  # the `agents` extra

    return reasoning_gym.get_score_answer_fn(name)


def final_answer(text: str) -> str:
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(text)
    if tagged is not None:
        return tagged.strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                  binary: bool = False, **kwargs: Any) -> float:
    """The dataset's score of the response's final answer, in [0, 1]; with ``binary`` (the scorer's ``kwargs``),
    1.0 only when the dataset scores it fully correct, else 0.0.

    Why ``binary`` exists: many datasets give partial credit to an answer that contains the right one
    (``len(answer) / len(found)`` when the oracle is a substring, e.g. 0.5 for ``15`` or ``-5`` when the answer is
    ``5``). On short numeric answers that credit rewards wrong numbers, and a policy trained on it learns them.
    """
    if not isinstance(ground_truth, dict) or not {"dataset", "entry"} <= ground_truth.keys():
        raise ValueError("the label must be {'dataset': name, 'entry': {...}} (examples/recipes/reasoning_gym_tasks/"
                         f"prepare.py writes it), got {str(ground_truth)[:120]!r}")
    score = float(_scorer(str(ground_truth["dataset"]))(final_answer(solution_str), ground_truth["entry"]))
    return (1.0 if score >= 1.0 else 0.0) if binary else score
