"""A torch.distributed process group per update group, formed and torn down without touching the default
group, with a timeout on forming it and on every collective.

The group is built the way SGLang's ``init_weights_update_group`` builds its side (a ``tcp://``
rendezvous, a ``PrefixStore`` named after the group, ``_new_process_group_helper``), so a FleetRL
publisher and an SGLang server land in the same group. gloo cannot shrink a group, so a failed group is
aborted and dropped, and the next round forms a fresh one (new port, new group name).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

log = logging.getLogger(__name__)


class CollectiveError(RuntimeError):
    """Forming the group or a collective failed or timed out; the group is unusable."""


class CollectiveGroup:
    """One member's handle on an update group (rank 0 is the publisher)."""

    def __init__(self, pg: Any, name: str, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
        self.pg, self.name, self.rank, self.world_size = pg, name, rank, world_size
        self.backend, self.timeout_s = backend, timeout_s
        self.broken = False

    @classmethod
    def open(cls, *, backend: str, master_addr: str, master_port: int, rank: int, world_size: int,
             group_name: str, init_timeout_s: float, collective_timeout_s: float) -> CollectiveGroup:
        """Form (join) the group; blocks until every rank joined or ``init_timeout_s`` passed."""
        init = datetime.timedelta(seconds=init_timeout_s)
        try:
            store, _, _ = next(c10d.rendezvous(f"tcp://{master_addr}:{master_port}", rank, world_size, timeout=init))
            store.set_timeout(init)
            store = c10d.PrefixStore(group_name, store)
            pg, _ = c10d._new_process_group_helper(
                world_size, rank, [], c10d.Backend(backend), store, group_name=group_name,
                timeout=datetime.timedelta(seconds=collective_timeout_s),
            )
            c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
        except Exception as exc:
            raise CollectiveError(f"forming group {group_name} (rank {rank}/{world_size}) failed: {exc}") from exc
        return cls(pg, group_name, rank, world_size, backend, collective_timeout_s)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> Any:
        """Post a broadcast; returns the work handle to pass to :meth:`wait`."""
        try:
            return dist.broadcast(tensor, src=src, group=self.pg, async_op=True)
        except Exception as exc:
            self.broken = True
            raise CollectiveError(f"broadcast in {self.name} failed: {exc}") from exc

    def wait(self, work: Any, timeout_s: float | None = None) -> None:
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s or self.timeout_s))
        except Exception as exc:
            self.broken = True
            raise CollectiveError(f"broadcast in {self.name} failed: {exc}") from exc

    def close(self) -> None:
        """Abort (if broken) and destroy the group; never raises, never blocks on a dead peer."""
        pg, self.pg = self.pg, None
        if pg is None:
            return
        if self.broken:
            for method in ("abort", "shutdown"):
                try:
                    getattr(pg, method)()
                    break
                except Exception:
                    continue
        try:
            dist.destroy_process_group(pg)
        except Exception as exc:
            log.debug("destroying group %s: %s", self.name, exc)
