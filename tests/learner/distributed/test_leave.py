"""Leaving the default process group frees it: no gloo thread is left when the interpreter exits (one
that is aborts the process now and then: "terminate called without an active exception", exit -6)."""

import os
import sys
from pathlib import Path

import msgpack
import pytest
import torch.multiprocessing as mp

from shared.redis_server import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")


def _threads() -> list[str]:
    return sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    from services.learner.distributed.channel import Op, StepChannel
    from services.learner.distributed.env import RankInfo, init_process_group, leave_process_group

    torch.set_num_threads(1)
    init_process_group(RankInfo(rank, 2, rank), "auto", 30.0, "cpu")
    # what transformers does when a trainer loads its model, after the group exists: this module binds
    # group.WORLD as a default argument when it is imported
    import torch.distributed.nn.functional

    ch = StepChannel(torch.device("cpu"))
    if rank == 0:
        ch.send(Op.STOP)
    else:
        assert ch.recv().op == Op.STOP
    during = _threads()
    leave_process_group()
    Path(out_dir, f"rank{rank}.msgpack").write_bytes(msgpack.packb({"during": during, "after": _threads()}))


def test_leaving_the_group_stops_its_threads_even_after_torch_distributed_nn_was_imported(tmp_path):
    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    for rank in (0, 1):
        got = msgpack.unpackb((tmp_path / f"rank{rank}.msgpack").read_bytes())
        assert any("gloo" in t for t in got["during"]), got  # the group did run gloo threads
        assert not [t for t in got["after"] if "gloo" in t], (rank, got["after"])
