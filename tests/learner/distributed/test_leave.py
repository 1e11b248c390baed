"""The learner's data-parallel group: rank 0's rendezvous store listens on MASTER_ADDR only, and leaving the
group frees it: no gloo thread is left when the interpreter exits (one that is aborts the process now and
then: "terminate called without an active exception", exit -6)."""

import os
import sys
from pathlib import Path

import msgpack
import pytest
import torch.multiprocessing as mp

from shared.ports import free_port

# multi-rank: torch.multiprocessing ranks
pytestmark = [pytest.mark.process, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")]


def _threads() -> list[str]:
    return sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    from services.learner.distributed.channel import Op, StepChannel
    from services.learner.distributed.env import RankInfo, init_process_group, leave_process_group

    torch.set_num_threads(1)
    init_process_group(RankInfo(rank, 2, rank, "127.0.0.1", port), "auto", 30.0, "cpu")
    # what transformers does when a trainer loads its model, after the group exists: this module binds
    # group.WORLD as a default argument when it is imported
    import torch.distributed.nn.functional

    ch = StepChannel(torch.device("cpu"))
    if rank == 0:
        ch.send(Op.STOP)
    else:
        assert ch.recv().op == Op.STOP
    from tests.sockets import beyond_loopback, listening

    during, socks, wide = _threads(), sorted(listening(os.getpid())), beyond_loopback(os.getpid())
    leave_process_group()
    Path(out_dir, f"rank{rank}.msgpack").write_bytes(msgpack.packb(
        {"during": during, "after": _threads(), "listening": socks, "wide": wide}))


def test_rank0_listens_on_master_addr_only_and_leaving_stops_the_groups_threads(tmp_path):
    port = free_port()
    mp.start_processes(_worker, args=(port, str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    for rank in (0, 1):
        got = msgpack.unpackb((tmp_path / f"rank{rank}.msgpack").read_bytes())
        assert not got["wide"], (rank, got["listening"])  # MASTER_ADDR is 127.0.0.1: nothing wider
        assert any("gloo" in t for t in got["during"]), got  # the group did run gloo threads
        # ... and none is left, although torch.distributed.nn was imported after the group was formed
        assert not [t for t in got["after"] if "gloo" in t], (rank, got["after"])
    assert ["127.0.0.1", port] in msgpack.unpackb((tmp_path / "rank0.msgpack").read_bytes())["listening"]
