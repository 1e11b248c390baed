"""The learner's ranks on this machine (``replicas.learner: N``): rank 0 is the service ``learner`` (HTTP, Redis,
the run); ranks 1..N-1 are ``learner-rank-<i>``, the same settings file, started beside it. They meet through the
launcher's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``:
``services/learner/distributed/env.py``): rank 0 hosts the rendezvous store on a free local port, the others dial
it. No torchrun: ``fleetrl run`` is the launcher, and it watches every rank."""

from __future__ import annotations

from shared.ports import free_port

FOLLOWER_PREFIX = "learner-rank-"


def follower_name(rank: int) -> str:
    """The service name (and log file) of learner rank ``rank`` > 0."""
    return f"{FOLLOWER_PREFIX}{rank}"


def is_follower(name: str) -> bool:
    return name.startswith(FOLLOWER_PREFIX)


def rank_envs(world: int, master_port: int | None = None, master_addr: str = "127.0.0.1") -> list[dict[str, str]]:
    """The environment of each rank (index = rank); empty mappings for one rank (a plain learner)."""
    if world <= 1:
        return [{}]
    port = str(master_port or free_port())
    return [{"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "MASTER_ADDR": master_addr,
             "MASTER_PORT": port} for r in range(world)]
