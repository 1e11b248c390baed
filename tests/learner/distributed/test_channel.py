"""Step messages between two real processes over gloo, and how groups are sharded."""

import os
from pathlib import Path

import msgpack
import pytest
import torch.multiprocessing as mp

from services.learner.distributed.channel import shard_groups
from shared.ports import free_port
from tests.learner.helpers import group

pytestmark = pytest.mark.process  # multi-rank: torch.multiprocessing ranks


def groups():
    return [group(f"g{i}", [[100] * (1 + i)] * n, [float(i)] * n) for i, n in enumerate([4, 2, 4, 3, 1])]


def test_shards_keep_groups_whole_and_balance_samples():
    shards = shard_groups(groups(), 2)
    assert sorted(len(s) for s in shards) == [7, 7]
    for s in shards:  # every group lives on exactly one rank
        for gid in {e.group_id for e in s}:
            assert [e.group_id for e in shards[0] + shards[1]].count(gid) == sum(e.group_id == gid for e in s)
    assert sorted(e.id for s in shards for e in s) == sorted(e.id for g in groups() for e in g)
    assert shard_groups(groups()[:1], 2)[1] == []  # fewer groups than ranks: an empty shard


def _fields(exps) -> list[dict]:
    """Everything but the creation timestamps (each process builds its own copy of the groups)."""
    return [e.model_dump(mode="json", exclude={"created_at", "generated_at"}) for e in exps]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    from services.learner.distributed.channel import Op, StepChannel
    from services.learner.distributed.env import RankInfo, init_process_group

    torch.set_num_threads(1)
    init_process_group(RankInfo(rank, 2, rank, "127.0.0.1", port), "auto", 30.0, "cpu")
    ch = StepChannel(torch.device("cpu"))
    if rank == 0:
        ch.send(Op.TRAIN, {"samples": 14}, shard_groups(groups(), 2))
        ch.send(Op.STOP)
    else:
        msgs = [ch.recv(), ch.recv()]
        record = {"ops": [m.op.name for m in msgs], "meta": msgs[0].meta,
                  "ids": [e.id for e in msgs[0].shard], "shard_ok": _fields(msgs[0].shard) == _fields(shard_groups(groups(), 2)[1])}
        Path(out).write_bytes(msgpack.packb(record))
    torch.distributed.destroy_process_group()


def test_rank1_receives_its_shard_and_the_control_ops(tmp_path):
    out = tmp_path / "rank1.msgpack"
    mp.start_processes(_worker, args=(free_port(), str(out)), nprocs=2, start_method="spawn", join=True)
    got = msgpack.unpackb(out.read_bytes())
    assert got["ops"] == ["TRAIN", "STOP"] and got["meta"] == {"samples": 14}
    assert got["shard_ok"] and got["ids"] == [e.id for e in shard_groups(groups(), 2)[1]]
