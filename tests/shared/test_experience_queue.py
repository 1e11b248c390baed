import asyncio
import time

import msgpack
import pytest

from shared.experience_queue import BackpressureTimeout, Lease, ProcessedIds, StreamQueue
from shared.schemas import PromptTask
from tests.procs import kill9, spawn
from tests.shared import queue_consumer as qc


def tasks(n, prefix="t"):
    return [PromptTask(id=f"{prefix}{i}", prompt=f"prompt {i}") for i in range(n)]


@pytest.mark.process
async def test_consumer_killed_mid_batch_loses_nothing_and_processes_nothing_twice(redis_client, redis_server, tmp_path):
    q = StreamQueue(redis_client, qc.STREAM, qc.GROUP, PromptTask, claim_idle_ms=300)
    await q.ensure_group()
    await q.produce(tasks(40))
    proc = spawn(["-m", "tests.shared.queue_consumer", redis_server.url, "doomed", "0.05"], tmp_path / "c.log")
    try:
        deadline = time.monotonic() + 60
        while await redis_client.hlen(qc.RESULTS) < 15:  # mid second batch of 10
            assert proc.poll() is None, (tmp_path / "c.log").read_text()
            assert time.monotonic() < deadline, "consumer made no progress"
            await asyncio.sleep(0.01)
    finally:
        kill9(proc)
    stats = await q.stats()
    assert stats.pending_per_consumer.get("doomed", 0) > 0, "the kill should leave entries pending on the dead consumer"

    seen = ProcessedIds(redis_client, qc.SEEN)
    survivor = StreamQueue(redis_client, qc.STREAM, qc.GROUP, PromptTask, claim_idle_ms=300)
    deadline = time.monotonic() + 30
    while (await survivor.stats()).length > 0:  # pending on the dead consumer or undelivered
        assert time.monotonic() < deadline, await survivor.stats()
        await qc.handle_batch(survivor, seen, await survivor.consume("survivor", count=10, block_ms=100), 0.0)

    results = {k.decode(): int(v) for k, v in (await redis_client.hgetall(qc.RESULTS)).items()}
    assert sorted(results) == sorted(t.id for t in tasks(40)), "every task processed"
    assert set(results.values()) == {1}, f"a task was processed twice: {results}"
    final = await survivor.stats()
    assert final.pending == 0 and final.dead_letters == 0


async def test_own_pending_entries_are_reread_after_restart(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask, claim_idle_ms=60_000)
    await q.produce(tasks(3))
    first = await q.consume("w", count=3, block_ms=10)
    assert [d.deliveries for d in first] == [1, 1, 1]
    restarted = StreamQueue(redis_client, "s", "g", PromptTask, claim_idle_ms=60_000)  # same consumer name
    again = await restarted.consume("w", count=3, block_ms=10)
    assert [d.id for d in again] == [d.id for d in first]
    assert [d.deliveries for d in again] == [1, 1, 1]  # replaying its own history is not a new delivery


async def test_undecodable_entry_goes_to_dead_letter_with_reason(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask)
    await q.produce(tasks(1, "ok"))
    await redis_client.xadd("s", {"p": msgpack.packb([1, 2, 3])})  # msgpack, but not a record
    await q.produce(tasks(1, "ok2"))
    got = await q.consume("w", count=10, block_ms=10)
    assert [d.record.id for d in got] == ["ok0", "ok20"]
    dead = await q.dead_letters()
    assert len(dead) == 1 and "undecodable" in dead[0]["error"] and "not a FleetRL record" in dead[0]["error"]
    stats = await q.stats()
    assert stats.dead_letters == 1 and stats.length == 2 and stats.pending == 2  # the poison entry left the stream


async def test_entry_failing_max_deliveries_times_is_dead_lettered(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask, max_deliveries=3, claim_idle_ms=20)
    await q.produce(tasks(1, "poison"))
    attempts = 0
    for _ in range(50):
        for d in await q.consume("w", count=1, block_ms=10):
            attempts += 1
            if await q.fail(d, "handler exploded: ZeroDivisionError"):
                break
        if (await q.stats()).dead_letters:
            break
        await asyncio.sleep(0.03)
    assert attempts == 3
    dead = await q.dead_letters()
    assert "failed 3 times: handler exploded" in dead[0]["error"]
    assert (await q.stats()).length == 0


async def test_backpressure_blocks_producer_until_consumer_catches_up(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask, max_backlog=5)
    await q.produce(tasks(5, "a"))
    blocked = asyncio.create_task(q.produce(tasks(2, "b"), timeout=30))
    await asyncio.sleep(0.3)
    assert not blocked.done(), "producer should wait while the backlog is at the limit"
    assert await q.backlog() == 5
    got = await q.consume("w", count=3, block_ms=10)
    ids = await asyncio.wait_for(blocked, 5)
    assert len(ids) == 2 and await q.backlog() == 4
    assert (await q.stats()).produce_wait_s_total >= 0.3
    assert await q.ack([d.id for d in got]) == 3


async def test_entries_held_unacked_by_a_consumer_do_not_stall_producers(redis_client):
    """A learner that acks only at checkpoints holds many pending entries; producers must go on."""
    q = StreamQueue(redis_client, "s", "g", PromptTask, max_backlog=4)
    held = []
    for round_ in range(5):
        await q.produce(tasks(4, f"r{round_}-"), timeout=2)
        held += await q.consume("learner", count=4, block_ms=10)
    stats = await q.stats()
    assert (stats.pending, stats.backlog, stats.length) == (20, 0, 20)
    assert await q.ack([d.id for d in held]) == 20


async def test_backpressure_times_out_and_never_trims_pending(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask, max_backlog=3)
    await q.produce(tasks(3))
    with pytest.raises(BackpressureTimeout, match="max_backlog=3"):
        await q.produce(tasks(1, "late"), timeout=0.3)
    assert await q.backlog() == 3
    pending = await q.consume("w", count=3, block_ms=10)
    assert await q.ack([d.id for d in pending]) == 3  # nothing was trimmed or lost


async def test_consume_recovers_when_the_stream_is_deleted(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask)
    await q.produce(tasks(1))
    await redis_client.delete("s")
    assert await q.consume("w", count=1, block_ms=10) == []
    await q.produce(tasks(1, "again"))
    assert [d.record.id for d in await q.consume("w", count=1, block_ms=10)] == ["again0"]


async def test_processed_ids_filter(redis_client):
    seen = ProcessedIds(redis_client, "seen")
    await seen.mark(["a", "b"])
    assert await seen.filter_new(["a", "c", "b", "d"]) == ["c", "d"]
    assert await seen.count() == 2


async def test_restarted_consumer_pages_through_its_history_once_without_raising_delivery_counts(redis_client):
    """A consumer that acks late (the learner: at checkpoints) holds more entries than one page. After a
    restart every consume() call must hand out the next page of its own history, each entry once, and
    replaying its own history must not count as a delivery (else valid entries end up dead-lettered)."""
    q = StreamQueue(redis_client, "s", "g", PromptTask, max_deliveries=2, claim_idle_ms=60_000)
    await q.produce(tasks(25))
    held = []
    while len(held) < 25:
        held += await q.consume("learner", count=10, block_ms=10)
    for _restart in range(3):  # three crashes in a row before anything was acknowledged
        restarted = StreamQueue(redis_client, "s", "g", PromptTask, max_deliveries=2, claim_idle_ms=60_000)
        pages = [await restarted.consume("learner", count=10, block_ms=10) for _ in range(8)]
        assert [len(p) for p in pages] == [10, 10, 5, 0, 0, 0, 0, 0]
        replayed = [d for p in pages for d in p]
        assert [d.id for d in replayed] == [d.id for d in held], "each own pending entry exactly once, in order"
        assert {d.deliveries for d in replayed} == {1}
    stats = await q.stats()
    assert stats.dead_letters == 0 and stats.pending == 25
    assert [r["times_delivered"] for r in await redis_client.xpending_range("s", "g", "-", "+", 100)] == [1] * 25


async def test_a_lease_keeps_a_live_consumers_entries_and_lets_a_stopped_ones_go(redis_client):
    q = StreamQueue(redis_client, "s", "g", PromptTask, claim_idle_ms=300)
    await q.produce(tasks(3))
    mine = await q.consume("alive", count=3, block_ms=10)
    lease = Lease(q, "alive")
    lease.hold(d.id for d in mine)
    lease.start()
    try:
        other = StreamQueue(redis_client, "s", "g", PromptTask, claim_idle_ms=300)
        deadline = time.monotonic() + 1.5  # five times claim_idle_ms
        while time.monotonic() < deadline:
            assert await other.consume("thief", count=3, block_ms=50) == [], "a live consumer's entry was taken"
            other._next_claim_at = 0.0  # scan for idle entries on every call
        assert lease.renewals >= 3
    finally:
        await lease.stop()  # now it behaves like a hung consumer: no renewals
    await asyncio.sleep(0.35)
    other._next_claim_at = 0.0
    taken = await other.consume("thief", count=3, block_ms=10)
    assert sorted(d.id for d in taken) == sorted(d.id for d in mine)
    assert {d.deliveries for d in taken} == {2}, "the renewals did not count as deliveries; the reclaim did"
    lost = []
    resumed = Lease(q, "alive", on_lost=lost.extend)
    resumed.hold(d.id for d in mine)
    assert sorted(await resumed.renew_now()) == sorted(d.id for d in mine) == sorted(lost)
    assert resumed.held == set()
    owners = {r["consumer"] for r in await redis_client.xpending_range("s", "g", "-", "+", 10)}
    assert owners == {b"thief"}, "a consumer that was stopped must not take back what another reclaimed"


async def test_entries_handed_back_are_taken_by_another_consumer_at_once_and_not_counted(redis_client):
    """A replica leaving the pool hands its prompts back: another consumer takes them on its next consume, long
    before claim_idle_ms, with the delivery count they had (a hand-back is not a failed delivery); entries the
    leaving consumer does not hold (settled, or another's) are left alone."""
    q = StreamQueue(redis_client, "hb", "g", PromptTask, claim_idle_ms=60_000)
    await q.produce(tasks(4))
    mine = await q.consume("leaving", count=3, block_ms=10)
    theirs = await q.consume("staying", count=1, block_ms=10)
    await q.ack([mine[2].id])  # finished before leaving
    back = await q.hand_back("leaving", [d.id for d in mine] + [theirs[0].id])
    assert sorted(back) == sorted(d.id for d in mine[:2])
    other = StreamQueue(redis_client, "hb", "g", PromptTask, claim_idle_ms=60_000)
    t0 = time.monotonic()
    taken = await other.consume("joiner", count=4, block_ms=10)
    assert time.monotonic() - t0 < 5.0
    assert sorted(d.id for d in taken) == sorted(back), "handed-back entries must be claimable at once"
    assert {d.deliveries for d in taken} == {1}, "a hand-back must not count as a delivery"
    owners = {r["message_id"].decode(): r["consumer"] for r in await redis_client.xpending_range("hb", "g", "-", "+", 10)}
    assert owners == {**{d.id: b"joiner" for d in taken}, theirs[0].id: b"staying"}


async def test_a_queue_recreates_its_group_wherever_it_finds_it_gone(redis_client):
    """Redis lost its data (a restart without persistence, a FLUSHALL): the queue's cached "group exists" is stale.
    Producing, stats, claiming and consuming recreate the group instead of failing with NOGROUP (the session
    server's /finish answered 500 NOGROUP after another client flushed the database)."""
    q = StreamQueue(redis_client, "s:tasks", "g", PromptTask, claim_idle_ms=1)
    await q.produce(tasks(2))
    await redis_client.flushall()
    assert await q.backlog() == 0
    await redis_client.flushall()
    assert (await q.stats()).length == 0
    await redis_client.flushall()
    await q.produce(tasks(3, "u"))
    got = await q.consume("c1", count=3, block_ms=100)
    assert sorted(d.record.id for d in got) == ["u0", "u1", "u2"]
    await redis_client.flushall()
    q._next_claim_at = 0.0  # the claim scan runs now
    assert await q.consume("c2", count=3, block_ms=10) == []
