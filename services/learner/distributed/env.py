"""Which rank this process is (torchrun / deepspeed env) and the process group with a timeout. Torch-free
until :func:`init_process_group` is called, so the CLI can decide what to start before importing torch.

The launcher's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_USE_AGENT_STORE``) are the launcher's contract, not FleetRL settings: they are read here, in
:meth:`RankInfo.from_env`, and nowhere else; the rest of the learner gets them from a :class:`RankInfo`."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    agent_store: bool = False  # torchrun's agent hosts the rendezvous store (TORCHELASTIC_USE_AGENT_STORE)

    @classmethod
    def from_env(cls) -> RankInfo:
        """What torchrun, deepspeed or a Ray placement group set; one rank of one when nothing is set."""
        env = os.environ
        port = env.get("MASTER_PORT")
        return cls(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")),
                   master_addr=env.get("MASTER_ADDR") or None, master_port=int(port) if port else None,
                   agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True")

    @property
    def multi(self) -> bool:
        return self.world_size > 1

    @property
    def owner(self) -> bool:
        """Rank 0 owns the run (HTTP, queue, prompts, run state, publishing, acks)."""
        return self.rank == 0


# torch modules whose functions take ``group=group.WORLD`` as a default argument: imported while the default
# group exists (transformers imports torch.distributed.nn when it loads a model), each keeps a reference to
# that group for the life of the process, so destroy_process_group() no longer frees it: its gloo threads
# then outlive the interpreter, and tearing them down at exit aborts the process now and then ("terminate
# called without an active exception", exit code -6). Imported before the group exists, the default is None.
_BINDS_WORLD_AT_IMPORT = (
    "torch.distributed.nn.functional",
    "torch.distributed.optim.zero_redundancy_optimizer",
    "torch.distributed.fsdp.sharded_grad_scaler",
)


def init_process_group(info: RankInfo, backend: str, timeout_s: float, device: str,
                       bind_addr: str | None = None) -> None:
    """Join the default group (gloo on CPU, nccl on CUDA unless ``backend`` names one) with a timeout.

    Rank 0 hosts the rendezvous store on ``MASTER_PORT`` and ``bind_addr`` (default ``MASTER_ADDR``) only:
    torch's ``env://`` would listen on every interface. The other ranks dial it through ``env://``. Under
    torchrun (``TORCHELASTIC_USE_AGENT_STORE``) the agent's store is used as it is."""
    if not info.multi:
        return
    import importlib
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_initialized():
        return
    for module in _BINDS_WORLD_AT_IMPORT:
        importlib.import_module(module)
    if backend == "auto":
        backend = "nccl" if device.startswith("cuda") else "gloo"
    timeout = timedelta(seconds=timeout_s)
    store = None
    if info.owner and not info.agent_store:
        from shared.weight_sync import net
        from shared.weight_sync.group import host_store

        if not info.master_addr or not info.master_port:
            raise RuntimeError("WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT (rank 0's address and port)")
        # the same key prefix env:// gives the default group, which the other ranks use
        store = dist.PrefixStore("default_pg", host_store(net.listen(bind_addr or info.master_addr, info.master_port),
                                                          info.world_size, timeout))
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size, timeout=timeout,
                            store=store)


def leave_process_group() -> None:
    """Destroy the default group (and every other one), so that its threads and sockets are gone before the
    interpreter exits; a no-op without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
