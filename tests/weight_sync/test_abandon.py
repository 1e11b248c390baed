"""A member stuck where no flag reaches it (gloo forming the group with a peer that never shows up: one blocking call,
bounded only by the collective timeout) still leaves the round as soon as the publisher marks it abandoned; the
thread ends its part on its own afterwards."""

from __future__ import annotations

import asyncio
import datetime
import time

import torch.distributed as dist

from services.rollout.weights.receiver import AbandonWatch, BucketReceiver, RoundAbandoned
from shared.ports import free_port
from shared.weight_sync import keys as wkeys
from shared.weight_sync.wire import Manifest, Member, Rendezvous, plan_buckets

COLLECTIVE_S = 6.0  # how long the member's gloo formation waits for the missing peer: the test allows a fraction


async def test_a_member_forming_the_group_leaves_as_soon_as_the_round_is_abandoned(redis_client):
    port = free_port()
    # the publisher's store, alive (its connections open), with a rank that never comes: rank 1 blocks forming its side
    store = dist.TCPStore("127.0.0.1", port, 3, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    buckets = tuple(plan_buckets([("w", "float32", (4,))], 1 << 20))
    manifest = Manifest(version=1, bucket_bytes=1 << 20, total_bytes=16, buckets=buckets)
    rdv = Rendezvous(round=7, version=1, manifest_key="unused", group_name=f"abandon-{port}", fresh_group=True,
                     backend="gloo", master_addr="127.0.0.1", master_port=port, world_size=3,
                     members=(Member(replica_id="me", rank=1), Member(replica_id="hung", rank=2)),
                     init_timeout_s=30.0, collective_timeout_s=COLLECTIVE_S, load_timeout_s=10.0)
    receiver = BucketReceiver(bind_addr="127.0.0.1")
    try:
        async with AbandonWatch(redis_client, "abandon", rdv.round) as watch:
            receiving = asyncio.ensure_future(asyncio.to_thread(receiver.receive, rdv, rdv.members[0], manifest,
                                                                watch.flag))
            await asyncio.sleep(0.5)  # in gloo's formation by now
            assert not receiving.done()
            marked = time.monotonic()
            await redis_client.set(wkeys.abandoned("abandon", rdv.round), "1")
            try:
                await watch.outlast(receiving)
                raise AssertionError("the round was abandoned, yet the receive returned")
            except RoundAbandoned:
                left = time.monotonic() - marked
        assert left < 1.5, f"left {left:.1f}s after the mark (its own bound: {COLLECTIVE_S}s)"
        assert watch.flag.is_set()
        # the thread ends its part by itself: formation fails at its own bound, and nothing is left held
        done, _ = await asyncio.wait({receiving}, timeout=COLLECTIVE_S + 20)
        assert done and receiver.group is None
    finally:
        del store


async def test_a_round_nobody_abandons_is_waited_for():
    """Without the mark, outlast is the work's own result (and its own failure)."""
    class NoRedis:
        async def exists(self, key):
            return 0

    async with AbandonWatch(NoRedis(), "abandon", 1, poll_s=0.01) as watch:
        assert await watch.outlast(asyncio.sleep(0.1, result="got")) == "got"
        try:
            await watch.outlast(asyncio.to_thread(_fail))
            raise AssertionError("the work's failure was swallowed")
        except ValueError:
            pass
    assert not watch.flag.is_set()


def _fail() -> None:
    raise ValueError("its own failure")
