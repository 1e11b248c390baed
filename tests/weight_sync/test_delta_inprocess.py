"""Delta rounds in one process: a real publisher and real weight sidecars (hf sink, receiver, gloo group, Redis),
each sidecar around a bare torch module instead of a generating engine, so that many rounds and every fault run in
seconds. After 20 delta rounds each replica's tensors are bit-equal to the learner's wire bytes; a corrupted patch,
a replica that missed a version and a replica restarted mid-run each get the version whole and end bit-equal.
(Across processes, with the peer joiner: test_delta_rounds.py.)"""

from __future__ import annotations

import asyncio

import torch

from services.learner.weights import WeightPublisher
from services.learner.weights import collective as C
from services.rollout.weights.receiver import UpdateRefused
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar
from shared.weight_sync import WeightSyncSettings
from shared.weight_sync.delta import HEADER
from shared.weight_sync.status import weight_sync_status
from tests.weight_sync.conftest import wait_alive

FAST = {"delta": "on", "init_timeout_s": 20, "collective_timeout_s": 10, "regroup_timeout_s": 5, "load_timeout_s": 20,
        "catch_up_poll_s": 0.1}


def make_model(seed: int | None = 0, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Embedding(300, 64), torch.nn.Linear(64, 128), torch.nn.LayerNorm(128),
                            torch.nn.Linear(128, 300, bias=False)).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            if seed is None:
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + p.numel())))
    return m


def nudge(model: torch.nn.Module, step: int, frac: float = 0.03) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < frac
            p.add_((mask * torch.randn(p.shape, generator=g) * 0.1).to(p.dtype))


class ModuleEngine:
    """The parts of an engine the hf sink uses, around a bare module."""

    kind, weight_sink = "hf", "services.rollout.weights.sinks.hf:HFSink"

    def __init__(self, model) -> None:
        self.model, self.weight_version = model, 0

    def set_weight_version(self, v: int) -> None:
        self.weight_version = v

    async def pause(self, mode: str = "wait", timeout: float | None = None) -> None:
        pass

    async def resume(self) -> None:
        pass


async def start_replica(redis, run: str, name: str, dtype: torch.dtype = torch.bfloat16) -> WeightSidecar:
    sc = WeightSidecar(ModuleEngine(make_model(seed=None, dtype=dtype)), redis, run,
                       SidecarSettings(join_timeout_s=0, heartbeat_s=0.2, heartbeat_ttl_s=10.0), name=name)
    await sc.start()
    return sc


def assert_bit_equal(learner: torch.nn.Module, reps: list[WeightSidecar]) -> None:
    want = learner.state_dict()
    for sc in reps:
        have = sc.engine.model.state_dict()
        for name, t in want.items():
            assert torch.equal(have[name].view(torch.uint8), t.view(torch.uint8)), f"{sc.name}: {name} differs"


def kinds(pub: WeightPublisher) -> set[str]:
    return set(pub.last_report.round_bytes)


async def test_delta_rounds_end_bit_equal_and_faults_get_full_rounds(redis_client, threads, monkeypatch):
    run = "delta-inproc"
    a, b = await start_replica(redis_client, run, "a"), await start_replica(redis_client, run, "b")
    model = make_model()
    reps = [a, b]
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=16 << 10, **FAST)) as pub:
            await wait_alive(pub, 2)
            assert await pub.publish(model) == 1
            assert kinds(pub) == {"full"} and len(pub.last_report.loaded) == 2
            full = pub.last_report.round_bytes["full"]
            for step in range(20):
                nudge(model, step)
                await pub.publish(model)
                r = pub.last_report
                assert kinds(pub) == {"delta"} and len(r.loaded) == 2, r
                assert r.round_bytes["delta"] < 0.25 * full and 0.01 < r.changed_fraction < 0.06, r
            assert all(sc.sink.phases.get("patch") is not None for sc in reps)
            assert_bit_equal(model, reps)

            # a corrupted patch (values flipped after the digests were taken): refused, sent whole in the same publish
            real = C.patch_tensor

            def corrupt(data: bytes, backend: str):
                t = real(data, backend)
                if t.numel() > HEADER.size + 8:
                    t[-2:] ^= 0xFF
                return t

            monkeypatch.setattr(C, "patch_tensor", corrupt)
            nudge(model, 100)
            await pub.publish(model)
            r = pub.last_report
            assert kinds(pub) == {"delta", "full"} and len(r.loaded) == 2 and not r.refused, r
            assert any("checksum" in e for e in r.errors), r.errors
            monkeypatch.setattr(C, "patch_tensor", real)
            assert_bit_equal(model, reps)
            nudge(model, 101)
            await pub.publish(model)
            assert kinds(pub) == {"delta"}

            # b misses a version (it refuses every round of it): the base stays, the next round is full for both
            missed = pub.delta.version + 1
            run_round = b.sink.run_round

            async def refuse_one(rdv, member, manifest, watcher):
                if rdv.version == missed:
                    await run_round(rdv, member, manifest, watcher)  # takes part in the broadcast, then refuses
                    raise UpdateRefused("test: this replica misses this version")
                return await run_round(rdv, member, manifest, watcher)

            monkeypatch.setattr(b.sink, "run_round", refuse_one)
            nudge(model, 102)
            assert await pub.publish(model) == missed
            assert pub.last_report.loaded == [a.replica_id] and pub.delta.version == missed - 1
            nudge(model, 103)
            await pub.publish(model)
            assert kinds(pub) == {"full"} and len(pub.last_report.loaded) == 2, pub.last_report
            assert_bit_equal(model, reps)
            nudge(model, 104)
            await pub.publish(model)
            assert kinds(pub) == {"delta"} and len(pub.last_report.loaded) == 2
            assert_bit_equal(model, reps)

            # b restarted mid-run (a new replica with blank weights): caught up whole, then level by delta
            await b.stop()
            c = await start_replica(redis_client, run, "c")
            reps = [a, c]
            for _ in range(400):
                if c.weight_version == pub.delta.version:
                    break
                await asyncio.sleep(0.05)
            assert c.last_update is not None and c.last_update.round is not None
            assert_bit_equal(model, reps)
            for step in range(105, 108):
                nudge(model, step)
                await pub.publish(model)
                assert kinds(pub) == {"delta"} and len(pub.last_report.loaded) == 2, pub.last_report
            assert_bit_equal(model, reps)
    finally:
        for sc in reps:
            await sc.stop()


async def test_full_every_and_delta_off(redis_client, threads):
    run = "delta-every"
    a = await start_replica(redis_client, run, "a", torch.float32)
    model = make_model(dtype=torch.float32)  # fp32: 4-byte units
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=16 << 10, full_every=3,
                                                                         **FAST)) as pub:
            await wait_alive(pub, 1)
            seen = []
            for step in range(7):
                nudge(model, step)
                await pub.publish(model)
                seen.append("+".join(sorted(kinds(pub))))
            assert seen == ["full", "delta", "delta", "full", "delta", "delta", "full"], seen
            assert_bit_equal(model, [a])
        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=16 << 10,
                                                                         **{**FAST, "delta": "off"})) as pub:
            for step in range(3):
                nudge(model, 50 + step)
                await pub.publish(model)
                assert kinds(pub) == {"full"}
            assert_bit_equal(model, [a])
    finally:
        await a.stop()


async def test_a_replica_holding_another_dtype_than_the_wire_takes_whole_rounds(redis_client, threads):
    run = "delta-dtype"
    a = await start_replica(redis_client, run, "a", torch.bfloat16)
    model = make_model(dtype=torch.float32)  # published as fp32 into a bf16 model: its bytes cannot be patched
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=16 << 10, **FAST)) as pub:
            await wait_alive(pub, 1)
            for step in range(3):
                nudge(model, step)
                await pub.publish(model)
                assert kinds(pub) == {"full"} and pub.last_report.loaded == [a.replica_id], pub.last_report
                assert not pub.last_report.errors
            assert not a.info().delta
    finally:
        await a.stop()


async def test_a_version_where_everything_changed_sends_every_bucket_whole(redis_client, threads):
    # patches are built while the round runs (bucket k+1's while bucket k is on the wire), so a dense version is
    # still a delta round, whose every bucket goes whole: the bytes of a full round, and the base moves with it
    run = "delta-dense"
    a = await start_replica(redis_client, run, "a")
    model = make_model()
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=16 << 10, **FAST)) as pub:
            await wait_alive(pub, 1)
            await pub.publish(model)
            nudge(model, 1, frac=1.0)  # every value moves: no patch would be smaller than its bucket
            await pub.publish(model)
            r = pub.last_report
            assert r.round_bytes == {"delta": r.total_bytes} and r.changed_fraction > 0.9 and r.loaded, r
            status = await weight_sync_status(redis_client, run)
            n_buckets = len(pub.outbox.manifest.buckets)
            assert status["last_round"]["whole_buckets"] == n_buckets and status["last_round"]["patch_bytes"] == 0
            assert_bit_equal(model, [a])
            nudge(model, 2)
            await pub.publish(model)  # and the base moved with it: the next sparse step sends patches
            r = pub.last_report
            assert kinds(pub) == {"delta"} and r.round_bytes["delta"] < 0.25 * r.total_bytes, r
            status = await weight_sync_status(redis_client, run)
            assert status["last_round"]["kind"] == "delta" and 0 < status["last_round"]["patch_bytes"] < r.total_bytes
            assert_bit_equal(model, [a])
    finally:
        await a.stop()


async def test_buckets_patched_in_pieces_end_bit_equal(redis_client, threads, monkeypatch):
    # a delta round cuts its buckets into pieces (a patch each, so members patch piece k while the publisher compares
    # piece k+1 within one bucket); here pieces of 4 KiB in buckets of 16 KiB and more, sparse and dense versions
    from services.learner.weights import delta as learner_delta

    monkeypatch.setattr(learner_delta, "PIECE_BYTES", 4096)
    run = "delta-pieces"
    a, b = await start_replica(redis_client, run, "a"), await start_replica(redis_client, run, "b")
    model = make_model()
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=16 << 10, **FAST)) as pub:
            await wait_alive(pub, 2)
            await pub.publish(model)
            for step, frac in enumerate((0.03, 0.03, 1.0, 0.03)):
                nudge(model, 200 + step, frac=frac)
                await pub.publish(model)
                r = pub.last_report
                assert kinds(pub) == {"delta"} and len(r.loaded) == 2 and not r.errors, r
                assert_bit_equal(model, [a, b])
                last = (await weight_sync_status(redis_client, run))["last_round"]
                want = sum(-(-bk.nbytes // 4096) for bk in pub.outbox.manifest.buckets)
                assert last["pieces"] == want > len(pub.outbox.manifest.buckets), last
                assert last["whole_buckets"] == (want if frac == 1.0 else 0), last
            assert r.round_bytes["delta"] < 0.25 * r.total_bytes, r
    finally:
        for sc in (a, b):
            await sc.stop()
