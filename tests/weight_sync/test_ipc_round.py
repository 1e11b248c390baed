"""The ipc transport's protocol on a real Redis, without a GPU: the round record (validated fields, nothing
unpickled), a replica finding the rounds that name it, and the publisher waiting only for the members' copies."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from services.learner.weights import WeightPublisher
from services.rollout.weights.receiver import RoundWatcher
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync import keys as wkeys
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.wire import IpcHandle, IpcRound, MemberReport, ReplicaInfo

HANDLE = {"device_uuid": "GPU-1234", "handle": "aGFuZGxl", "storage_nbytes": 4096, "storage_offset": 0,
              "ref_counter_handle": "cmVm", "ref_counter_offset": 0, "offset": 1024, "nbytes": 2048}


def ipc_round(members: tuple[str, ...], round_id: int = 7) -> IpcRound:
    return IpcRound(round=round_id, version=3, manifest_key="m", members=members, handles=(IpcHandle(**HANDLE),),
                    init_timeout_s=5, collective_timeout_s=5, load_timeout_s=5, checksum="wsum64")


def test_round_record_round_trips_and_refuses_what_it_does_not_know():
    rnd = ipc_round(("a", "b"))
    assert IpcRound.loads(rnd.dumps()) == rnd and rnd.member("a") == "a" and rnd.member("z") is None
    with pytest.raises(ValidationError):
        IpcHandle(**{**HANDLE, "offset": -1})
    with pytest.raises(ValidationError):
        IpcHandle(**HANDLE, pickle="gASV")  # extra fields are refused, not carried
    with pytest.raises(ValidationError):
        IpcHandle(**{**HANDLE, "handle": "x" * 600})


async def test_a_replica_finds_only_ipc_rounds_that_name_it(redis_client):
    watcher = RoundWatcher(redis_client, "ipcw", "me", key=wkeys.ipc_round("ipcw"), record=IpcRound)
    await redis_client.set(wkeys.ipc_round("ipcw"), ipc_round(("other",), 1).dumps())
    assert await watcher.wait(0.05) is None
    await redis_client.set(wkeys.ipc_round("ipcw"), ipc_round(("other", "me"), 2).dumps())
    found = await watcher.wait(0.05)
    assert found is not None and found[0].round == 2 and found[1] == "me"
    assert await watcher.wait(0.05) is None  # handled once


async def test_publisher_waits_for_copies_not_for_the_switch(redis_client):
    run = "ipcc"
    reg = ReplicaRegistry(redis_client, run)
    members = [ReplicaInfo(replica_id=r, name=r, transport="ipc") for r in ("fast", "stuck", "refuses")]
    for m in members:
        await reg.put(m, 30)
    async with WeightPublisher(redis_client, run, WeightSyncSettings()) as pub:
        transport = pub.transports["ipc"]
        fast = RoundWatcher(redis_client, run, "fast")

        async def members_act() -> None:
            await asyncio.sleep(0.2)
            await fast.copied(ipc_round(("fast",), 9))  # copied: the publisher may move on
            rep = MemberReport(replica_id="refuses", round=9, version=3, state="refused", detail="bad digest")
            await redis_client.hset(wkeys.reports(run, 9), "refuses", rep.dumps())
            await redis_client.rpush(wkeys.reported(run, 9), "refuses")

        t0 = time.monotonic()
        acting = asyncio.ensure_future(members_act())
        copied = await transport._copies(9, members, timeout_s=1.5)
        await acting
        assert copied == {"fast"}
        assert 1.4 < time.monotonic() - t0 < 5  # "stuck" is alive and silent: waited for, up to the timeout
        out = await transport._settle(9, [m for m in members if m.replica_id != "fast"], 0.2)
        assert out.refused == ["refuses"] and out.dropped == ["stuck"] and out.details["refuses"] == "bad digest"
