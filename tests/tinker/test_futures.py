"""Futures and ordered workers: a model's requests run in seq_id order whatever order they arrive in, a refused
seq_id is skipped rather than waited for, failures become the client's error / category, and unknown ids are 410."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.learner.tinker.errors import BadRequest, Gone
from services.learner.tinker.futures import FutureStore, OrderedWorker


async def test_requests_run_in_seq_order_and_a_skipped_seq_is_not_waited_for():
    store = FutureStore(ttl_s=60)
    worker = OrderedWorker("m", store, gap_timeout_s=600)  # a wait for a gap would outlast the test
    ran: list[int] = []
    lock = threading.Lock()

    def job(seq):
        def run():
            with lock:
                ran.append(seq)
            return {"seq": seq}
        return run

    ids = {}
    worker.expect(1)
    for seq in (3, 5, 2, 1):  # out of order; 4 is refused at the door
        ids[seq] = store.create()
        worker.submit(ids[seq], seq, job(seq))
    worker.skip(4)
    results = [await asyncio.wait_for(store.retrieve(ids[s], 30), 60) for s in (1, 2, 3, 5)]
    assert [r.result["seq"] for r in results] == [1, 2, 3, 5]
    assert ran == [1, 2, 3, 5]
    await worker.close()


async def test_failures_carry_their_category_and_unknown_ids_are_gone():
    store = FutureStore(ttl_s=60)
    worker = OrderedWorker("m", store, gap_timeout_s=1)
    user, server = store.create(), store.create()

    def refuse():
        raise BadRequest("data[0]: bad shape")

    def crash():
        raise RuntimeError("CUDA error")

    worker.submit(user, None, refuse)
    worker.submit(server, None, crash)
    u = await store.retrieve(user, 30)
    s = await store.retrieve(server, 30)
    assert (u.error, u.category) == ("data[0]: bad shape", "user")
    assert (s.error, s.category) == ("RuntimeError: CUDA error", "server")
    with pytest.raises(Gone):
        await store.retrieve("never-issued", 1)
    await worker.close()


async def test_a_running_request_answers_try_again_after_the_long_poll():
    store = FutureStore(ttl_s=60)
    worker = OrderedWorker("m", store, gap_timeout_s=1)
    release = threading.Event()
    rid = store.create()
    worker.submit(rid, None, lambda: release.wait(30) and {"ok": True})
    assert await store.retrieve(rid, 0.2) is None  # still running: the route says try_again
    release.set()
    assert (await store.retrieve(rid, 30)).result == {"ok": True}
    await worker.close()


async def test_fetched_results_go_after_a_minute_unfetched_ones_after_the_ttl():
    now = [1000.0]
    store = FutureStore(ttl_s=3600, clock=lambda: now[0])
    fetched, unfetched = store.create(), store.create()
    for rid in (fetched, unfetched):
        store.settle(rid, lambda: {"ok": True})
    assert (await store.retrieve(fetched, 1)).result == {"ok": True}
    now[0] += 30
    store.create()  # creating expires
    assert (await store.retrieve(fetched, 1)).result == {"ok": True}  # a re-poll within the minute
    now[0] += 61
    store.create()
    with pytest.raises(Gone):
        await store.retrieve(fetched, 1)
    assert (await store.retrieve(unfetched, 1)) is not None
    now[0] += 3601
    store.create()
    with pytest.raises(Gone):
        await store.retrieve(unfetched, 1)
