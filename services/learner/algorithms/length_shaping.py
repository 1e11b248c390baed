"""What happens to samples that ran out of tokens (finish reason ``length``), as pure tensor functions.

- ``mask`` (DAPO "overlong filtering"): a truncated sample leaves the loss (its reward says nothing about
  an answer it never finished).
- ``soft_penalty`` (DAPO "soft overlong punishment"): with a budget ``L`` and a buffer ``C``, a response of
  ``n`` tokens gets ``0`` up to ``L - C``, ``(L - C - n) / C`` (from 0 down to -1) inside the buffer, and
  ``-1`` beyond ``L``; added to its reward, times ``coef``.
- ``none``: nothing.
"""

from __future__ import annotations

import torch


def soft_overlong_penalty(lengths: torch.Tensor, budget: int, buffer: int) -> torch.Tensor:
    """[B] penalties in [-1, 0] for response lengths ``lengths`` (see the module docstring)."""
    if not 0 < buffer <= budget:
        raise ValueError(f"the overlong buffer ({buffer}) must be in (0, budget={budget}]")
    n = lengths.to(torch.float32)
    start = budget - buffer
    inside = (start - n) / buffer
    return torch.where(n <= start, torch.zeros_like(n), torch.where(n <= budget, inside, -torch.ones_like(n)))


def keep_unless_truncated(truncated: torch.Tensor) -> torch.Tensor:
    """[B] 1.0 for samples that finished, 0.0 for those cut by the length limit."""
    return (~truncated.bool()).to(torch.float32)
