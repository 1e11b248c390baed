"""Rank 0 -> all ranks control + data messages over the default process group (gloo / nccl).

One message = a header ``int64[2] = (op, nbytes)`` broadcast from rank 0, then (if ``nbytes``) a
``uint8[nbytes]`` payload: a msgpack map ``{"meta": {...}, "shards": [[record, ...] per rank]}`` whose
records are ``shared.codec`` encodings of :class:`Experience`. No pickle anywhere; every rank decodes
only its own shard. Collective timeouts come from the process group (``init_process_group(timeout=)``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch
import torch.distributed as dist

from shared import codec
from shared.schemas import Experience


class Op(enum.IntEnum):
    START = 0  # meta: total_steps, resume_dir
    TRAIN = 1  # shards + meta: scores (the whole batch), samples
    PUBLISH = 2  # weights are gathered (collective for sharded backends); rank 0 publishes
    CHECKPOINT = 3  # meta: path (the trainer dir of the checkpoint being written)
    NOOP = 4  # heartbeat while rank 0 waits for rollouts (keeps followers inside the timeout)
    STOP = 5


@dataclass(frozen=True)
class Message:
    op: Op
    meta: dict[str, Any] = field(default_factory=dict)
    shard: list[Experience] = field(default_factory=list)


class StepChannel:
    """``send`` on rank 0, ``recv`` on the others; call both in the same order on every rank."""

    def __init__(self, device: torch.device) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = device  # nccl needs CUDA tensors; gloo uses CPU
        self.last_send = time.monotonic()

    def send(self, op: Op, meta: dict[str, Any] | None = None,
             shards: Sequence[Sequence[Experience]] | None = None) -> None:
        if self.rank != 0:
            raise RuntimeError("only rank 0 sends step messages")
        body = {"meta": meta or {}, "shards": [[codec.encode(e) for e in s] for s in (shards or [])]}
        payload = msgpack.packb(body, use_bin_type=True)
        header = torch.tensor([int(op), len(payload)], dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
        dist.broadcast(data, src=0)
        self.last_send = time.monotonic()

    def recv(self) -> Message:
        header = torch.zeros(2, dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        op, n = Op(int(header[0])), int(header[1])
        data = torch.empty(n, dtype=torch.uint8, device=self.device)
        dist.broadcast(data, src=0)
        body = msgpack.unpackb(data.cpu().numpy().tobytes(), raw=False, strict_map_key=True)
        shards = body.get("shards") or []
        mine = shards[self.rank] if self.rank < len(shards) else []
        return Message(op, body.get("meta") or {}, [codec.decode(b, expect=Experience) for b in mine])


def shard_groups(groups: Sequence[Sequence[Experience]], world: int) -> list[list[Experience]]:
    """Whole groups per rank, balanced by sample count (greedy: biggest group to the lightest rank).

    Groups stay whole so per-group baselines (GRPO, RLOO) come out the same as on one rank.
    """
    shards: list[list[Experience]] = [[] for _ in range(world)]
    order = sorted(range(len(groups)), key=lambda i: -len(groups[i]))
    for i in order:
        lightest = min(range(world), key=lambda r: (len(shards[r]), r))
        shards[lightest] += list(groups[i])
    return shards
