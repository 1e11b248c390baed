"""Which rank this process is (torchrun / deepspeed env) and the process group with a timeout. Torch-free
until :func:`init_process_group` is called, so the CLI can decide what to start before importing torch."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> RankInfo:
        """``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` as set by torchrun, deepspeed or a Ray placement group."""
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def multi(self) -> bool:
        return self.world_size > 1

    @property
    def owner(self) -> bool:
        """Rank 0 owns the run (HTTP, queue, prompts, run state, publishing, acks)."""
        return self.rank == 0


def init_process_group(info: RankInfo, backend: str, timeout_s: float, device: str) -> None:
    """Join the default group (gloo on CPU, nccl on CUDA unless ``backend`` names one) with a timeout."""
    if not info.multi:
        return
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_initialized():
        return
    if backend == "auto":
        backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size,
                            timeout=timedelta(seconds=timeout_s))
