"""A weight transport's behaviour outside its own classes comes from what it declares on them, never from its
name: a third-party transport registered in a test gets exactly the behaviour it declares (delta and adapter
rounds, catching up from peers, the digest ``checksum_algo: auto`` takes, placement rules), the same way the
built-ins do; and no module under services/, shared/ or deploy/ compares a transport's name with a literal."""

from __future__ import annotations

import ast
import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from deploy.run.placement import PlacementSpec, place
from services.learner.weights.publisher import WeightPublisher
from services.learner.weights.transport import PUBLISHER_TRANSPORTS, Shipment, WeightTransport
from services.rollout.weights.settings import REPLICA_TRANSPORTS, SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar
from services.rollout.weights.sinks.base import WeightSink
from services.rollout.weights.transport import ReplicaTransport
from shared import keys
from shared.settings import SettingsError
from shared.weight_sync.placement import PlacementError, Route, TransportPlacement, check_route
from shared.weight_sync.settings import WeightSyncSettings
from shared.weight_sync.wire import ReplicaInfo
from tests.procs import REPO

NAME = "declared_test"


class _Engine:
    kind = "hf"
    weight_version = 0


class _Sink(WeightSink):
    """A sink that applies patches and loads adapters (so what a replica advertises is up to its transport)."""

    accepts_delta = True

    async def run_round(self, rdv, member, manifest, watcher) -> None:
        raise AssertionError("no round is published here")

    async def load_snapshot(self, manifest) -> None:
        raise AssertionError("no snapshot is published here")


class PlainJoin(ReplicaTransport):
    """A third-party replica side declaring nothing: it gets the base class's defaults."""

    name = NAME

    def __init__(self, sidecar: Any) -> None:
        super().__init__(sidecar)
        self.requested: list[int] = []

    async def request(self, version: int) -> None:
        self.requested.append(version)


class DeclaringJoin(PlainJoin):
    """A third-party replica side declaring every capability the other way round from the defaults."""

    takes_delta = True
    takes_adapters = True
    catches_up_from_peers = False
    placement = TransportPlacement(shares_device_memory=True)


class _PeerAsks(WeightSidecar):
    """Records each catch-up it tries from a peer (none answers here)."""

    peer_asked: list[int]

    async def from_peer(self, version: int) -> bool:
        self.peer_asked.append(version)
        return False


def _sidecar(redis: Any, run: str) -> _PeerAsks:
    settings = SidecarSettings(transport=NAME, adapters="on", join_timeout_s=0, heartbeat_s=0.05, poll_s=0.1,
                               peer=False)
    engine = _Engine()
    sidecar = _PeerAsks(engine, redis, run, settings, sink=_Sink(engine, settings))
    sidecar.peer_asked = []
    return sidecar


@pytest.mark.parametrize("join", [PlainJoin, DeclaringJoin])
async def test_a_registered_replica_transport_advertises_what_it_declares(registered, redis_client, join):
    registered(REPLICA_TRANSPORTS, NAME, None, join)
    info = _sidecar(redis_client, "declared-info").info()
    assert info.transport == NAME
    assert (info.delta, info.adapters) == (join.takes_delta, join.takes_adapters) == \
        ((False, False) if join is PlainJoin else (True, True))


@pytest.mark.parametrize("join", [PlainJoin, DeclaringJoin])
async def test_a_replica_behind_asks_a_peer_first_only_if_its_transport_catches_up_from_peers(
        registered, redis_client, join):
    registered(REPLICA_TRANSPORTS, NAME, None, join)
    run = f"declared-peers-{join.__name__}"
    sidecar = _sidecar(redis_client, run)
    await sidecar.start()
    try:
        sidecar.peer_asked.clear()  # joining asks a peer whatever the transport; the loop of latest checks is tested
        await redis_client.set(keys.weights_version(run), 3)
        deadline = time.monotonic() + 10
        while not sidecar.transport.requested and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        await sidecar.stop()
    assert sidecar.transport.requested[:1] == [3]  # then the transport is asked, either way
    assert bool(sidecar.peer_asked) is join.catches_up_from_peers
    assert sidecar.peer_asked[:1] == ([3] if join is PlainJoin else [])


class PlainSend(WeightTransport):
    """A third-party publisher side declaring nothing."""

    name = NAME

    async def deliver(self, replicas: list[ReplicaInfo], shipment: Shipment) -> None: ...


class DeclaringSend(PlainSend):
    sends_delta = True
    auto_digest = "crc32"


@pytest.mark.parametrize("send", [PlainSend, DeclaringSend])
async def test_a_registered_publisher_transport_gets_delta_rounds_and_the_digest_it_declares(
        registered, redis_client, send):
    registered(PUBLISHER_TRANSPORTS, NAME, None, send)
    settings = WeightSyncSettings()
    assert settings.checksum_algo == "auto"
    mine = ReplicaInfo(replica_id="r-mine", name="mine", transport=NAME, backend=settings.backend, delta=True)
    collective = ReplicaInfo(replica_id="r-coll", name="coll", transport="collective", backend=settings.backend,
                             delta=True)
    async with WeightPublisher(redis_client, "declared-publisher", settings) as pub:
        members = [i.replica_id for i in pub._delta_members([mine, collective])]
        assert members == (["r-mine", "r-coll"] if send.sends_delta else ["r-coll"])
        assert pub._digest_algo([collective]) == settings.digest_algo != "crc32"
        assert pub._digest_algo([collective, mine]) == ("crc32" if send is DeclaringSend else settings.digest_algo)


def test_check_route_applies_the_placement_rules_a_transport_declares(registered):
    registered(REPLICA_TRANSPORTS, NAME, None, DeclaringJoin)
    check_route(Route(NAME), "cuda:0", "cuda:1", placement=PlainJoin.placement)  # no rules declared: no refusal
    with pytest.raises(PlacementError, match=f"weights transport {NAME} shares GPU memory"):
        check_route(Route(NAME), "cuda:0", "cuda:1", placement=DeclaringJoin.placement)
    # fleetrl run reads the rules from the registered transport
    with pytest.raises(SettingsError, match=f"weights transport {NAME} shares GPU memory"):
        place({}, [{"weights": {"transport": NAME}}], PlacementSpec(rollout="cuda:1"), gpus=2)


def test_fleetrl_run_places_a_transport_that_declares_no_rules_anywhere(registered):
    registered(REPLICA_TRANSPORTS, NAME, None, PlainJoin)
    rollouts: list[dict] = [{"weights": {"transport": NAME}}]
    lines = place({}, rollouts, PlacementSpec(rollout="cuda:0"), gpus=2)
    assert lines == [f"rollout-0 on cuda:0, learner on cuda:0: weights by {NAME}"]
    assert rollouts[0]["weights"] == {"transport": NAME}


def _name_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing something named ``transport`` (``x.transport``, ``transport.name``, ``settings.transport``)
    with a string literal (``==``, ``!=``, ``in``)."""

    def names_transport(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "transport" or (node.attr == "name" and names_transport(node.value))
        return isinstance(node, ast.Name) and node.id == "transport"

    def literal(node: ast.AST) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(literal(e) for e in node.elts)
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(names_transport(s) for s in sides) and any(literal(s) for s in sides):
                found.append(node.lineno)
    return found


def test_the_name_check_finds_a_comparison():
    code = 'if route.transport == "ipc" or self.transport.name != "snapshot" or i.transport in ("a", "b"): pass'
    assert _name_comparisons(ast.parse(code)) == [1, 1, 1]
    assert _name_comparisons(ast.parse("if info.transport == self.name and t.sends_delta: pass")) == []


def test_no_code_compares_a_transport_name_with_a_literal():
    found = []
    for top in ("services", "shared", "deploy"):
        for path in sorted((Path(REPO) / top).rglob("*.py")):
            found += [f"{path.relative_to(REPO)}:{line}" for line in _name_comparisons(ast.parse(path.read_text()))]
    assert found == [], "declare the behaviour on the transport classes instead (docs/plugins.md): " + ", ".join(found)
