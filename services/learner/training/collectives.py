"""The few collectives the trainer needs; on one rank every function is the identity (no process group)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
import torch.distributed as dist

from services.learner.algorithms.masked import masked_whiten


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """Elementwise sum over ranks (float64 on the wire for exact token counts)."""
    if not active():
        return values
    out = values.detach().to(torch.float64).clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(values.dtype)


def all_reduce_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks in one flat buffer (losses are already divided by global counts).

    Parameters without a gradient on this rank (e.g. an empty shard) contribute zeros.
    """
    if not active():
        return
    params = list(params)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]  # every one, after the zeros above
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def global_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """:func:`masked_whiten` with mean and variance over the action tokens of every rank's shard."""
    if not active():
        return masked_whiten(x, mask, eps=eps)
    m = mask.to(x.dtype)
    s = all_sum(torch.stack([(x * m).sum(), m.sum()]).double())
    mean = (s[0] / s[1].clamp(min=1.0)).to(x.dtype)
    var = (all_sum(((x - mean) ** 2 * m).sum().double().reshape(1))[0] / s[1].clamp(min=1.0)).to(x.dtype)
    return (x - mean) * var.clamp(min=eps).rsqrt() * m


def replica_digests(model: torch.nn.Module) -> list[str]:
    """sha256 of this rank's parameters, gathered from every rank (equal digests = identical replicas)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    mine = h.hexdigest()
    if not active():
        return [mine]
    device = next(model.parameters()).device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor(list(bytes.fromhex(mine)), dtype=torch.uint8, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [bytes(o.cpu().tolist()).hex() for o in out]
