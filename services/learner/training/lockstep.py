"""Passes every rank runs together under a sharded backend (FSDP): each forward all-gathers every layer's
parameters and each backward reduce-scatters its gradients, so all ranks must run as many passes of each
model, in the same order, even when their shards hold different numbers of micro-batches (or none).

:func:`extra_passes` agrees on the count (one all-reduce of the most passes any rank has); a rank with fewer
runs the difference as :func:`idle_pass`: a one-token forward (and a backward of zero) that joins the
collectives and adds nothing to any gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from services.learner.training.collectives import active


def extra_passes(mine: int, lockstep: bool) -> int:
    """How many idle passes this rank adds to its ``mine`` real ones so that every rank runs the same count
    (0 without lockstep or without a process group; collective otherwise: call it on every rank)."""
    if not lockstep or not active():
        return 0
    n = torch.tensor([mine], dtype=torch.int64)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n[0]) - mine


def idle_pass(model: nn.Module, device: torch.device, backward: bool) -> None:
    """One forward of a single token through ``model`` (an HF causal LM or the critic), and with ``backward``
    a backward of zero times its output: the collectives of a pass with no gradient contribution (x + 0 = x)."""
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    mask = torch.ones(1, 1, dtype=torch.long, device=device)
    with torch.set_grad_enabled(backward):
        out = model(input_ids=ids, attention_mask=mask)
        out = getattr(out, "logits", out)
        if backward:
            (out.float().sum() * 0.0).backward()
