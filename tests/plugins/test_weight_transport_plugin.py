"""A third-party weight transport, registered on both sides under one name: the replica's settings choose it
(``weights.transport``), the rollout service's sidecar runs it and advertises it, and the learner's publisher
hands each version to it for exactly the replicas advertising it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

from services.learner.weights.publisher import WeightPublisher
from services.learner.weights.transport import PUBLISHER_TRANSPORTS, Shipment, WeightTransport
from services.rollout.weights.settings import REPLICA_TRANSPORTS, SidecarSettings
from services.rollout.weights.transport import LastUpdate, ReplicaTransport
from shared.weight_sync.registry import ReplicaRegistry
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import ReplicaInfo

NAME = "mailbox_test"
DELIVERED: dict[str, list[str]] = {}  # transport name -> replica ids a publish handed it


def mailbox(run: str, replica_id: str) -> str:
    return f"test:mailbox:{run}:{replica_id}"


class MailboxTransport(WeightTransport):
    """Publisher side: leaves the version number in each replica's mailbox (a Redis key)."""

    name = NAME

    async def deliver(self, replicas: list[ReplicaInfo], shipment: Shipment) -> None:
        DELIVERED.setdefault(self.name, []).extend(r.replica_id for r in replicas)
        for r in replicas:
            await self.redis.set(mailbox(self.run, r.replica_id), shipment.report.version)
            shipment.report.loaded.append(r.replica_id)


class MailboxJoin(ReplicaTransport):
    """Replica side: reads its mailbox and records the version it found as its last update."""

    name = NAME

    def loops(self) -> list[Any]:
        return [self._watch()]

    async def request(self, version: int) -> None: ...

    async def _watch(self) -> None:
        sc = self.sidecar
        while not sc.stopping:
            raw = await sc.redis.get(mailbox(sc.run, sc.watcher.replica_id))
            if raw is not None and (sc.last_update is None or sc.last_update.version != int(raw)):
                sc.last_update = LastUpdate(version=int(raw), state="loaded", source=self.name, seconds=0.0)
            await sc.sleep(0.05)


@pytest.fixture
def mailbox_transport(registered):
    registered(REPLICA_TRANSPORTS, NAME, None, MailboxJoin)
    registered(PUBLISHER_TRANSPORTS, NAME, None, MailboxTransport)
    DELIVERED.clear()


def test_weights_transport_accepts_only_registered_names(registered):
    with pytest.raises(ValueError, match=r"unknown weight transport \(replica\) 'mailbox_test'; known: 'collective', "
                                         r"'snapshot', 'ipc'"):
        SidecarSettings(transport=NAME)
    registered(REPLICA_TRANSPORTS, NAME, None, MailboxJoin)
    assert SidecarSettings(transport=NAME).transport == NAME


async def test_a_registered_transport_runs_on_both_sides(redis_server, redis_client, tiny_model_dir, mailbox_transport):
    from services.rollout.service import RolloutService
    from services.rollout.settings import RolloutSettings

    run = "plugin-transport"
    settings = RolloutSettings(
        model=str(tiny_model_dir), redis_url=redis_server.url, run_name=run, weight_sidecar=True,
        engine={"kind": "hf", "device": "cpu", "torch_threads": 1},
        weights={"transport": NAME, "join_timeout_s": 0, "heartbeat_s": 0.2})
    svc = RolloutService(settings)
    await svc.start()
    try:
        sidecar = svc.weight_sidecar
        assert isinstance(sidecar.transport, MailboxJoin)
        deadline = time.monotonic() + 20
        while not (alive := await ReplicaRegistry(redis_client, run).alive()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        (info,) = alive
        assert info.transport == NAME
        async with WeightPublisher(redis_client, run, WeightSyncSettings()) as pub:
            assert isinstance(pub.transports[NAME], MailboxTransport)
            version = await pub.publish({"w": torch.ones(4)})
            assert pub.last_report.loaded == [info.replica_id]
        assert DELIVERED == {NAME: [info.replica_id]}
        while (sidecar.last_update is None or sidecar.last_update.version != version) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sidecar.last_update.source == NAME and sidecar.last_update.version == version
    finally:
        await svc.stop()
