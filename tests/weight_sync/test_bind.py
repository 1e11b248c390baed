"""Where weight sync listens: the publisher's rendezvous store and both sides' gloo sockets stay on the
address the settings name (127.0.0.1 by default, never every interface), on the configured ports."""

from __future__ import annotations

import os
import socket

import pytest

from services.learner.weights import WeightPublisher
from shared.weight_sync import WeightSyncSettings, net
from shared.weight_sync import keys as wkeys
from shared.weight_sync.wire import Rendezvous
from tests.sockets import beyond_loopback, listening
from tests.weight_sync.conftest import new_weights, wait_ready, wait_registered

FAST = {"init_timeout_s": 20, "collective_timeout_s": 10, "regroup_timeout_s": 5, "load_timeout_s": 20,
        "catch_up_poll_s": 0.1}


def free_range(n: int) -> int:
    """A port p such that p .. p + n - 1 are all free on 127.0.0.1 now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            net.listen("127.0.0.1", base, 1).close()
            for p in range(base + 1, base + n):
                net.listen("127.0.0.1", p, 1).close()
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def assert_loopback_only(pid: int, what: str) -> set[tuple[str, int]]:
    wide = beyond_loopback(pid)
    assert not wide, f"{what} listens beyond loopback: {wide} (all: {sorted(listening(pid))})"
    return listening(pid)


async def test_groups_listen_on_loopback_and_the_configured_ports(replicas, redis_client, tiny_model_dir):
    run = "bind"
    a = replicas(run)
    await wait_registered(redis_client, run, 1)
    base = free_range(2)
    settings = WeightSyncSettings(bucket_bytes=64 << 10, rendezvous_port=base, rendezvous_ports=2, **FAST)
    assert settings.listen_addr == "127.0.0.1"
    async with WeightPublisher(redis_client, run, settings) as pub:
        assert await pub.publish(new_weights(tiny_model_dir)) == 1
        assert len(pub.last_report.loaded) == 1, pub.last_report
        # the group is held between versions: its store and both sides' gloo sockets are open now
        rdv = Rendezvous.loads(await redis_client.get(wkeys.rendezvous(run)))
        assert (rdv.master_addr, rdv.master_port) == ("127.0.0.1", base)
        mine = assert_loopback_only(os.getpid(), "the publisher")
        assert ("127.0.0.1", base) in mine
        assert len(mine) >= 2, mine  # the store, and gloo's listener
        assert_loopback_only(a.proc.pid, "the replica")

        # a late joiner is served in a catch-up group of its own while the first one is held (the next port),
        # then the next version forms a group of both, back on the first port: the replica that held the
        # old group of that name forms the new one
        b = replicas(run, wait=False)
        await wait_ready(b)
        assert b.weight_version() == 1
        assert await pub.publish(new_weights(tiny_model_dir, seed=2)) == 2
        assert len(pub.last_report.loaded) == 2 and not pub.last_report.dropped, pub.last_report
        rdv = Rendezvous.loads(await redis_client.get(wkeys.rendezvous(run)))
        assert rdv.master_port == base and rdv.fresh_group
        assert ("127.0.0.1", base) in assert_loopback_only(os.getpid(), "the publisher")
        for rep in (a, b):
            assert_loopback_only(rep.proc.pid, "a replica")
            assert rep.weight_version() == 2


def test_listen_takes_the_first_free_port_of_the_range_and_says_what_to_do_when_none_is():
    base = free_range(2)
    first = net.listen("127.0.0.1", base, 2)
    try:
        second = net.listen("127.0.0.1", base, 2)
        try:
            assert second.getsockname() == ("127.0.0.1", base + 1)
            with pytest.raises(OSError, match="rendezvous_ports"):
                net.listen("127.0.0.1", base, 2)
        finally:
            second.close()
    finally:
        first.close()
    anywhere = net.listen("127.0.0.1")
    try:
        assert anywhere.getsockname()[0] == "127.0.0.1" and anywhere.getsockname()[1] > 0
    finally:
        anywhere.close()


def test_addresses():
    assert net.route_addr("127.0.0.1") == "127.0.0.1"
    assert net.is_loopback("localhost") and net.is_loopback("127.0.0.2") and net.is_loopback("::1")
    assert not net.is_loopback("10.0.0.1") and not net.is_loopback("learner")
    assert net.is_wildcard("0.0.0.0") and net.is_wildcard("[::]") and not net.is_wildcard("127.0.0.1")


def test_settings_bounds_and_defaults():
    from pydantic import ValidationError

    from services.rollout.weights.settings import SidecarSettings

    s = WeightSyncSettings()
    assert (s.listen_addr, s.gloo_addr, s.rendezvous_port) == ("127.0.0.1", "127.0.0.1", 0)
    assert WeightSyncSettings(master_addr="10.1.2.3").listen_addr == "10.1.2.3"  # listens where replicas dial
    assert WeightSyncSettings(master_addr="10.1.2.3", bind_addr="0.0.0.0").gloo_addr is None
    with pytest.raises(ValidationError, match="past 65535"):
        WeightSyncSettings(rendezvous_port=65534, rendezvous_ports=4)
    with pytest.raises(ValidationError, match="loopback only"):
        WeightSyncSettings(master_addr="10.1.2.3", bind_addr="127.0.0.1")
    with pytest.raises(ValidationError):
        WeightSyncSettings(rendezvous_port=70000)
    assert SidecarSettings().bind_addr is None
    with pytest.raises(ValidationError, match="must be able to dial"):
        SidecarSettings(bind_addr="0.0.0.0")


def test_pynccl_rank0_store_listens_on_the_given_socket_only(monkeypatch):
    """The publisher's side of a vLLM (PyNccl) group, with stand-ins for vLLM's classes: the store vLLM's
    server dials is served on the socket the publisher bound (127.0.0.1 here), not on every interface."""
    import dataclasses
    import datetime
    import sys
    import threading
    import types

    import torch
    import torch.distributed as dist

    from shared.weight_sync.group import PyNcclGroup

    @dataclasses.dataclass
    class StatelessProcessGroup:  # vLLM < 0.19's fields: a listening socket without a default
        rank: int
        world_size: int
        store: object
        socket: object
        data_expiration_seconds: int = 3600

    seen = {}

    class PyNcclCommunicator:
        def __init__(self, pg, device):
            seen["pg"], seen["listening"] = pg, listening(os.getpid())
            pg.store.set("broadcast_from/0/0", b"unique-id")  # what vLLM's rank 0 does with the NCCL id

    vllm = types.ModuleType("vllm")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.distributed", types.ModuleType("vllm.distributed"))
    monkeypatch.setitem(sys.modules, "vllm.distributed.utils",
                        types.SimpleNamespace(StatelessProcessGroup=StatelessProcessGroup))
    monkeypatch.setitem(sys.modules, "vllm.distributed.device_communicators", types.ModuleType("x"))
    monkeypatch.setitem(sys.modules, "vllm.distributed.device_communicators.pynccl",
                        types.SimpleNamespace(PyNcclCommunicator=PyNcclCommunicator))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    listener = net.listen("127.0.0.1")
    port = listener.getsockname()[1]
    got = {}

    def vllm_server():  # rank 1 dials the store, as StatelessProcessGroup.create does for rank > 0
        client = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(seconds=20))
        got["id"] = client.get("broadcast_from/0/0")

    t = threading.Thread(target=vllm_server)
    t.start()
    group = PyNcclGroup.open(backend="nccl", master_addr="127.0.0.1", master_port=port, rank=0, world_size=2,
                             group_name=f"fleetrl-weights-{port}", init_timeout_s=20, collective_timeout_s=20,
                             listener=listener)
    t.join(30)
    assert got["id"] == b"unique-id" and seen["pg"].socket is None and seen["pg"].rank == 0
    assert ("127.0.0.1", port) in seen["listening"]
    assert not [(a, p) for a, p in seen["listening"] if not net.is_loopback(a)], seen["listening"]
    group.close()
