"""SGLang / vLLM sinks against a stand-in server that speaks their documented weight endpoints and runs
the receiving side of the broadcast itself (gloo on CPU here; NCCL in the gpu test)."""

from __future__ import annotations

import zlib
from contextlib import asynccontextmanager

import httpx
import pytest
import torch

from services.learner.weights import WeightPublisher
from services.rollout.engines.base import engine_class
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar
from shared.ports import free_port
from shared.weight_sync import WeightSyncSettings
from tests.procs import THREAD_ENV, spawn, stop, wait_http_ok
from tests.weight_sync.conftest import wait_registered

pytestmark = pytest.mark.process  # stand-in engine processes


class RemoteEngine:
    """What the sink uses of the rollout's sglang / vllm engine objects."""

    def __init__(self, kind: str, base_url: str) -> None:
        self.kind, self.base_url, self.client = kind, base_url, httpx.AsyncClient()
        self.weight_sink = engine_class(kind).weight_sink  # the real engine's sink
        self.weight_version, self.paused, self.pauses = 0, False, 0

    def set_weight_version(self, v: int) -> None:
        self.weight_version = v

    async def pause(self, mode: str = "wait", timeout: float | None = None) -> None:
        self.paused = True
        self.pauses += 1

    async def resume(self) -> None:
        self.paused = False


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(12):
        out[f"model.layers.{i}.mlp.weight"] = torch.randn(64, 48, generator=g)
        out[f"model.layers.{i}.norm.weight"] = torch.randn(48, generator=g).to(torch.bfloat16)
        out[f"model.layers.{i}.mlp.experts.count"] = torch.arange(i + 3, dtype=torch.int64)
    return out


@asynccontextmanager
async def standin_replica(tmp_path, redis_client, run: str, kind: str, vllm: str = "0.33.0", sglang: str = "0.5.23",
                          **sidecar_settings):
    """A stand-in engine server (its own process, imitating the releases named) with a sidecar driving it
    through ``kind``'s sink."""
    port = free_port()
    log = tmp_path / f"standin-{port}.log"
    proc = spawn(["-m", "tests.weight_sync.standin_engine", str(port), vllm, sglang], log, THREAD_ENV)
    engine = RemoteEngine(kind, f"http://127.0.0.1:{port}")
    sidecar = WeightSidecar(engine, redis_client, run,
                            SidecarSettings(join_timeout_s=0, heartbeat_s=0.3, **sidecar_settings))
    try:
        wait_http_ok(f"{engine.base_url}/health", proc, 60, log)
        await sidecar.start()
        yield engine, sidecar
    finally:
        try:
            await sidecar.stop()
            await engine.client.aclose()
        finally:
            stop(proc)


def crc(t: torch.Tensor) -> int:
    return zlib.crc32(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))


@pytest.mark.parametrize(("kind", "release"), [("sglang", "0.5.23"), ("vllm", "0.33.0"), ("vllm", "0.17.0")])
async def test_remote_sink_maps_requests_and_bytes_arrive(kind, release, tmp_path, redis_client):
    run = f"sink-{kind}"
    # the stand-in receives over a torch gloo group on CPU; a real vLLM server joins a PyNccl group (the
    # sidecar's default for vllm, tests/weight_sync/test_real_engines_gpu.py)
    releases = {"vllm": release} if kind == "vllm" else {"sglang": release}
    async with standin_replica(tmp_path, redis_client, run, kind, **releases, group="torch") as (engine, sidecar):
        await wait_registered(redis_client, run, 1)
        settings = WeightSyncSettings(bucket_bytes=16 << 10, init_timeout_s=30, collective_timeout_s=20,
                                      load_timeout_s=30)
        async with WeightPublisher(redis_client, run, settings) as pub:
            for version, seed in ((1, 1), (2, 2)):
                w = weights(seed)
                assert await pub.publish(w) == version
                assert pub.last_report.loaded == [sidecar.replica_id], pub.last_report
                got = (await engine.client.get(f"{engine.base_url}/standin/state", timeout=10)).json()
                assert got["crc"] == {n: crc(t) for n, t in w.items()}
                assert engine.weight_version == version and not engine.paused
            nb = len(pub.outbox.manifest.buckets)
        assert nb > 3
        calls = got["calls"]
        if kind == "sglang":
            # one group formed once and reused; one control call per bucket, never one per tensor
            assert calls.count("/init_weights_update_group") == 1
            assert calls.count("/update_weights_from_distributed") == 2 * nb
            assert got["weight_version"] == "2"
        elif release == "0.33.0":
            # the four steps each round, the packed parameters once at init, the version kept by the server
            assert calls == ["/pause?mode=abort", "/init_weight_transfer_engine", "/start_weight_update",
                             "/update_weights", "/finish_weight_update", "/resume",
                             "/pause?mode=abort", "/start_weight_update", "/update_weights", "/finish_weight_update",
                             "/resume"]
            assert sidecar.sink.wire_at_init is True and sidecar.sink.sessions is True
            assert got["weight_version"] == "2"
        else:
            # 0.17 refuses the packed parameters at init (the sink then sends them per round) and has no session
            assert calls == ["/pause?mode=abort", "/init_weight_transfer_engine", "/update_weights", "/resume",
                             "/pause?mode=abort", "/update_weights", "/resume"]
            assert sidecar.sink.wire_at_init is False and sidecar.sink.sessions is False
        if kind == "vllm":
            assert got["unpaused_updates"] == 0 and got["paused"] is False
        assert engine.pauses == 2


async def test_a_vllm_session_left_open_by_a_broken_round_is_closed_before_the_next(tmp_path, redis_client):
    """vLLM 0.33 refuses a second /start_weight_update while a session is open: a round that broke after
    starting one leaves it open, and the next round closes it first instead of failing forever."""
    async with standin_replica(tmp_path, redis_client, "sink-open", "vllm", group="torch") as (engine, sidecar):
        await wait_registered(redis_client, "sink-open", 1)
        r = await engine.client.post(f"{engine.base_url}/start_weight_update", json={}, timeout=10)
        assert r.status_code == 200  # what a broken round leaves behind
        settings = WeightSyncSettings(bucket_bytes=16 << 10, init_timeout_s=30, collective_timeout_s=20,
                                      load_timeout_s=30)
        async with WeightPublisher(redis_client, "sink-open", settings) as pub:
            w = weights(3)
            assert await pub.publish(w) == 1
            assert pub.last_report.loaded == [sidecar.replica_id], pub.last_report
        got = (await engine.client.get(f"{engine.base_url}/standin/state", timeout=10)).json()
        assert got["crc"] == {n: crc(t) for n, t in w.items()} and got["weight_version"] == "1"
        assert got["calls"].count("/finish_weight_update") == 2 and got["paused"] is False


async def test_an_sglang_server_older_than_flat_buckets_is_refused_naming_its_release(tmp_path, redis_client):
    """SGLang 0.5.4 ignores load_format and would take a flat bucket as its first tensor: the sink reads the
    release and refuses before joining any group."""
    from services.rollout.weights.sinks.base import UpdateRefused

    async with standin_replica(tmp_path, redis_client, "sink-old", "sglang", sglang="0.5.4.post3") as (
            engine, sidecar):
        with pytest.raises(UpdateRefused, match=r"SGLang 0\.5\.4\.post3 .*load_format since 0\.5\.6"):
            await sidecar.sink._check_release()
        got = (await engine.client.get(f"{engine.base_url}/standin/state", timeout=10)).json()
        assert got["calls"] == []


async def test_replicas_of_different_group_kinds_update_in_separate_rounds(replicas, redis_client, tiny_model_dir,
                                                                          tmp_path, monkeypatch):
    """An hf replica (torch group) and a vLLM server (its own PyNccl group) in one fleet: each version goes
    out in one round per kind, and each kind's group is kept for the next version."""
    from shared.weight_sync import group as groups
    from tests.weight_sync.conftest import new_weights, reference_ids

    # No GPU here: the publisher forms the vLLM replicas' group with torch/gloo, which the stand-in server
    # joins; everything else (registration, partitioning, rendezvous, reports) is the real path.
    monkeypatch.setitem(groups.GROUP_KINDS, "pynccl", groups.CollectiveGroup)
    run = "kinds"
    hf = replicas(run)
    async with standin_replica(tmp_path, redis_client, run, "vllm") as (engine, sidecar):
        assert sidecar.info().group == "pynccl"  # a vllm sink's own kind
        await wait_registered(redis_client, run, 2)
        settings = WeightSyncSettings(bucket_bytes=64 << 10, init_timeout_s=30, collective_timeout_s=20,
                                      load_timeout_s=30)
        async with WeightPublisher(redis_client, run, settings) as pub:
            for version, seed in ((1, 1), (2, 2)):
                model = new_weights(tiny_model_dir, seed=seed)
                assert await pub.publish(model) == version
                rep = pub.last_report
                assert rep.rounds == 2 and len(rep.loaded) == 2 and not rep.dropped, rep
                assert hf.generate()["output_ids"] == reference_ids(model, tiny_model_dir)
                got = (await engine.client.get(f"{engine.base_url}/standin/state", timeout=10)).json()
                names = pub.outbox.manifest.tensor_names()  # the tied lm_head goes once, as the embedding
                state = model.state_dict()
                assert got["crc"] == {n: crc(state[n]) for n in names}
                assert engine.weight_version == version
            assert sorted(pub.transports["collective"].held) == ["pynccl", "torch"]
        assert got["calls"].count("/init_weight_transfer_engine") == 1  # its group was reused for version 2
