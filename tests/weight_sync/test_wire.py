"""Pure parts of the protocol: bucket planning, packing, checksums, snapshot files, in-place loading."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from services.learner.weights import packing
from services.learner.weights.snapshot import write_snapshot
from services.rollout.weights.loader import InPlaceLoader, unpack
from services.rollout.weights.snapshot import read_snapshot
from shared.weight_sync.digest import digest
from shared.weight_sync.tensors import staging_buffers
from shared.weight_sync.wire import Manifest, Rendezvous, plan_buckets


def test_buckets_close_after_passing_the_limit_and_stay_in_order():
    specs = [("a", "float32", (10,)), ("b", "bfloat16", (3, 4)), ("c", "float32", (100,)), ("d", "int8", (5,))]
    buckets = plan_buckets(specs, 50)
    assert [[e.name for e in b.tensors] for b in buckets] == [["a", "b"], ["c"], ["d"]]
    assert [(e.offset, e.nbytes) for e in buckets[0].tensors] == [(0, 40), (40, 24)]
    assert [b.nbytes for b in buckets] == [64, 400, 5]
    with pytest.raises(ValueError, match="complex64"):
        plan_buckets([("z", "complex64", (2,))], 50)


def test_wire_records_round_trip_as_json_and_reject_unknown_fields():
    m = Manifest(version=3, bucket_bytes=50, total_bytes=64,
                 buckets=tuple(plan_buckets([("a", "float32", (10,)), ("b", "bfloat16", (3, 4))], 50)))
    assert Manifest.loads(m.dumps()) == m
    with pytest.raises(ValueError):
        Rendezvous.loads('{"round": 1, "pickle": "x"}')


def test_pack_unpack_tied_weights_checksum_and_in_place_load(tmp_path):
    src = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7, bias=True))
    src[1].weight = src[0].weight  # tied: sent once
    src[1].bias.data = src[1].bias.data.to(torch.bfloat16)
    named = packing.named_tensors(src)
    assert [n for n, _ in named] == ["0.weight", "1.bias"]
    buckets = plan_buckets(packing.specs(named), 1 << 20)
    buf = packing.pack_bucket(buckets[0], dict(named))
    assert dict(unpack(buckets[0], buf))["1.bias"].dtype == torch.bfloat16
    crc = digest(buf, "xxh3_64")
    buf2 = buf.clone()
    buf2[3] ^= 1
    assert digest(buf2, "xxh3_64") != crc

    dst = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7, bias=True))
    dst[1].weight = dst[0].weight
    dst[1].bias.data = dst[1].bias.data.to(torch.bfloat16)
    ptr = dst[0].weight.data_ptr()
    loader = InPlaceLoader(dst)
    loader.check(buckets[0].tensors)
    for e in buckets[0].tensors:
        loader.copy_bytes(e, buf)
    assert dst[0].weight.data_ptr() == ptr  # in place
    assert torch.equal(dst[0].weight, src[0].weight) and torch.equal(dst[1].weight, src[0].weight)
    assert torch.equal(dst[1].bias, src[1].bias)

    bad = plan_buckets([("0.weight", "float32", (3, 3))], 1 << 20)
    with pytest.raises(ValueError, match="shape"):
        loader.check(bad[0].tensors)

    info = write_snapshot(tmp_path, 5, buckets, [buf], keep=1)
    on_disk = load_file(f"{info.path}/{info.files[0]}")  # a plain safetensors file
    assert torch.equal(on_disk["0.weight"], src[0].weight)
    assert torch.equal(next(read_snapshot(info))["1.bias"], src[1].bias)
    (tmp_path / info.path / info.files[0]).write_bytes(b"x" * 10)
    with pytest.raises(Exception, match="checksum"):
        next(read_snapshot(info))


def test_adopt_repoints_tensors_and_alternating_sets_stay_independent():
    src = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
    named = packing.named_tensors(src)
    buckets = plan_buckets(packing.specs(named), 64)
    assert len(buckets) > 1
    dst = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
    loader = InPlaceLoader(dst)
    sets = [staging_buffers([b.nbytes for b in buckets]) for _ in range(2)]
    for b, buf in zip(buckets, sets[0]):
        packing.pack_bucket(b, dict(named), out=buf)
    assert loader.adopt(buckets, sets[0])
    assert all(torch.equal(a, b) for a, b in zip(dst.state_dict().values(), src.state_dict().values()))
    sets[1][0].fill_(0)  # receiving the next version into the other set leaves the model alone
    assert torch.equal(dst[0].weight, src[0].weight)
    assert loader.adopt(buckets, sets[1]) and float(dst[0].weight.abs().sum()) == 0.0
    # a checksum still catches a single flipped byte
    crc = digest(sets[0][0], "xxh3_64")
    sets[0][0][5] ^= 1
    assert digest(sets[0][0], "xxh3_64") != crc


def test_adopt_copies_into_aliased_tensors():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(3, 2))
            self.b = torch.nn.Parameter(self.a.data)  # shares storage, another Parameter object

    dst = Tied()
    w = {"a": torch.arange(6, dtype=torch.float32).reshape(3, 2)}
    buckets = plan_buckets(packing.specs(w.items()), 1 << 20)
    bufs = [packing.pack_bucket(buckets[0], w)]
    InPlaceLoader(dst).adopt(buckets, bufs)
    assert torch.equal(dst.a, w["a"]) and torch.equal(dst.b, w["a"])  # both names see the update


def test_flatten_puts_every_bucket_in_place_and_training_keeps_working():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    before = model(x).detach().clone()
    named = packing.named_tensors(model)
    params = [p for _, p in named]
    buckets = plan_buckets(packing.specs(named), 200)
    assert len(buckets) > 1
    # scattered tensors must be packed (a bucket of one tensor is always in place)
    assert all(packing.bucket_view(b, dict(named)) is None for b in buckets if len(b.tensors) > 1)
    assert any(len(b.tensors) > 1 for b in buckets)
    packing.flatten_into_buckets(named, buckets)
    assert [p for _, p in packing.named_tensors(model)] == params  # the same Parameter objects
    assert torch.equal(model(x), before)
    lookup = dict(packing.named_tensors(model))
    views = [packing.bucket_view(b, lookup) for b in buckets]
    assert all(v is not None for v in views)
    assert all(torch.equal(v, packing.pack_bucket(b, lookup)) for v, b in zip(views, buckets))
    # a training step updates the parameters in place, so the views carry the new weights
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x).square().mean().backward()
    opt.step()
    assert not torch.equal(model(x), before)
    assert all(torch.equal(v, packing.pack_bucket(b, lookup)) for v, b in zip(views, buckets))


def test_a_tensor_that_cannot_be_aligned_keeps_its_bucket_packed():
    w = {"odd": torch.ones(3, dtype=torch.bfloat16), "f": torch.arange(4, dtype=torch.float32)}
    module = torch.nn.Module()
    for k, v in w.items():
        module.register_parameter(k, torch.nn.Parameter(v))
    named = packing.named_tensors(module)
    buckets = plan_buckets(packing.specs(named), 1 << 20)  # one bucket; "f" sits at byte 6, not 4-aligned
    packing.flatten_into_buckets(named, buckets)
    lookup = dict(packing.named_tensors(module))
    assert packing.bucket_view(buckets[0], lookup) is None
    assert torch.equal(dict(unpack(buckets[0], packing.pack_bucket(buckets[0], lookup)))["f"], w["f"])


async def test_watcher_rebuilds_a_known_layout_without_fetching(redis_client):
    from services.rollout.weights.receiver import RoundFailed, RoundWatcher
    from shared.weight_sync.wire import Manifest, Rendezvous, layout_id

    buckets = tuple(plan_buckets([("a", "float32", (4, 4)), ("b", "bfloat16", (8,))], 32))
    lid = layout_id(buckets, 32)
    m1 = Manifest(version=1, bucket_bytes=32, total_bytes=80, buckets=buckets, checksum="xxh3_64", layout_id=lid)
    await redis_client.set("m:1", m1.dumps())

    def rdv(version: int, key: str, layout: str) -> Rendezvous:
        return Rendezvous(round=version, version=version, manifest_key=key, group_name="g", fresh_group=True,
                          backend="gloo", master_addr="127.0.0.1", master_port=1, world_size=2, members=(),
                          init_timeout_s=1, collective_timeout_s=1, load_timeout_s=1, layout_id=layout,
                          checksum="crc32")

    watcher = RoundWatcher(redis_client, "run", "r1")
    assert await watcher.manifest(rdv(1, "m:1", lid)) == m1  # first sight: fetched
    got = await watcher.manifest(rdv(2, "m:2", lid))          # m:2 was never written: rebuilt from the layout
    assert got.version == 2 and got.buckets == buckets and got.checksum == "crc32"
    with pytest.raises(RoundFailed, match="gone"):               # an unknown layout must be fetched; never
        await watcher.manifest(rdv(3, "m:3", "other-layout"))    # written: refused after a bounded wait

    # a manifest written just after its rendezvous (publishers do that when members hold the layout) is
    # waited for
    import asyncio

    m4 = m1.model_copy(update={"version": 4})

    async def write_late() -> None:
        await asyncio.sleep(0.2)
        await redis_client.set("m:4", m4.dumps())

    task = asyncio.create_task(write_late())
    assert await watcher.manifest(rdv(4, "m:4", "another-layout")) == m4
    await task


async def test_settle_wakes_as_soon_as_a_member_reports(redis_client):
    import asyncio
    import time

    from services.learner.weights import WeightPublisher
    from services.rollout.weights.receiver import RoundWatcher
    from shared.weight_sync import keys as wkeys
    from shared.weight_sync.wire import Member, Rendezvous, ReplicaInfo

    run = "settle"
    pub = WeightPublisher(redis_client, run)
    members = [ReplicaInfo(replica_id=f"r{i}", name=f"r{i}", transport="collective") for i in (1, 2)]
    for m in members:
        await pub.registry.put(m, ttl_s=30)
    rdv = Rendezvous(round=5, version=1, manifest_key="m", group_name="g", fresh_group=True, backend="gloo",
                     master_addr="127.0.0.1", master_port=1, world_size=3,
                     members=tuple(Member(replica_id=m.replica_id, rank=i + 1) for i, m in enumerate(members)),
                     init_timeout_s=1, collective_timeout_s=1, load_timeout_s=1)

    async def report_later() -> None:
        await asyncio.sleep(0.1)
        await RoundWatcher(redis_client, run, "r1").report(rdv, "loaded")
        await asyncio.sleep(0.1)
        await RoundWatcher(redis_client, run, "r2").report(rdv, "refused", "bad bucket")

    task = asyncio.create_task(report_later())
    t0 = time.monotonic()
    out = await pub.transports["collective"]._settle(5, members, timeout_s=30)
    waited = time.monotonic() - t0
    await task
    assert out.loaded == ["r1"] and out.refused == ["r2"] and not out.dropped and not out.retry
    # woken by the reports (~0.2 s), not by the 0.5 s liveness pacing of its blocking reads
    assert waited < 0.45, waited
    assert await redis_client.exists(wkeys.reported(run, 5)) == 0  # the wake-up list is cleaned up
    assert 0 < await redis_client.ttl(wkeys.reports(run, 5))


async def test_watcher_wakes_as_soon_as_a_round_is_announced(redis_client):
    import asyncio
    import time

    from services.rollout.weights.receiver import RoundWatcher
    from shared.weight_sync import keys as wkeys
    from shared.weight_sync.wire import Member, Rendezvous

    run = "announce"
    watcher = RoundWatcher(redis_client, run, "r1")
    assert await watcher.wait(0.05) is None  # nothing published yet

    async def publish_later() -> None:
        await asyncio.sleep(0.3)
        rdv = Rendezvous(round=7, version=2, manifest_key="m", group_name="g", fresh_group=True, backend="gloo",
                         master_addr="127.0.0.1", master_port=1, world_size=2,
                         members=(Member(replica_id="r1", rank=1),), init_timeout_s=1, collective_timeout_s=1,
                         load_timeout_s=1)
        pipe = redis_client.pipeline(transaction=False)
        pipe.set(wkeys.rendezvous(run), rdv.dumps())
        pipe.xadd(wkeys.announcements(run), {"round": "7"})
        await pipe.execute()

    task = asyncio.create_task(publish_later())
    t0 = time.monotonic()
    found = await watcher.wait(10.0)
    waited = time.monotonic() - t0
    await task
    assert found is not None and found[0].round == 7 and found[1].rank == 1
    assert waited < 3.0, waited  # woken by the announcement, not by the 10 s timeout
    assert await watcher.wait(0.05) is None  # a round is handed out once


def test_module_walk_is_reused_until_the_structure_changes():
    from services.learner.weights.walk import ModuleWalk

    def state_names(m):
        return [n for n, _ in packing.named_tensors(m)]

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    model.register_buffer("steps", torch.zeros(1))
    model.register_buffer("cache", torch.zeros(3), persistent=False)
    walk = ModuleWalk()

    def check(expect_walks: int) -> None:
        got = packing.named_tensors(model, walk)
        assert [n for n, _ in got] == state_names(model) == [n for n in model.state_dict()]
        assert all(t is dict(packing.module_tensors(model))[n] for n, t in got)
        assert walk.walks == expect_walks

    check(1)
    check(1)                                                   # nothing changed: no walk
    with torch.no_grad():
        model[0].weight.add_(1)
    check(1)                                                   # values are not structure
    model[0].weight = torch.nn.Parameter(torch.ones(4, 4))     # a replaced parameter is read afresh
    check(1)
    model[1] = torch.nn.LayerNorm(4)                           # a replaced module
    check(2)
    model.append(torch.nn.Linear(2, 2))                        # an added module
    check(3)
    model[0].register_buffer("extra", torch.ones(1))           # an added buffer
    check(4)
    model[0].bias = None                                       # a parameter removed from the state dict
    check(5)
    model.cache_flag = torch.nn.Module()                       # an added (empty) child still counts
    check(6)


async def test_in_place_views_are_rechecked_when_a_tensor_moves(redis_client):
    from services.learner.weights import WeightPublisher
    from shared.weight_sync import WeightSyncSettings

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    pub = WeightPublisher(redis_client, "views", WeightSyncSettings(bucket_bytes=1 << 20))
    pub.flatten(model)
    await pub.publish(model)  # no replicas: the bucket is still prepared, as for a late joiner
    assert pub.outbox.in_place == [True]
    await pub.publish(model)
    assert pub.outbox.in_place == [True]  # unchanged: the remembered view is sent
    model[1].weight.data = torch.zeros(8, 8)  # a tensor moved out of the flat buffer
    await pub.publish(model)
    assert pub.outbox.in_place == [False]
    assert torch.equal(dict(unpack(pub.outbox.manifest.buckets[0], pub.outbox.wire[0]))["1.weight"], torch.zeros(8, 8))
    await pub.close()
