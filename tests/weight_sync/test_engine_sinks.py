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
from tests.procs import spawn, stop, wait_http_ok
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
async def standin_replica(tmp_path, redis_client, run: str, kind: str, vllm_api: str = "update",
                          **sidecar_settings):
    """A stand-in engine server (its own process) with a sidecar driving it through ``kind``'s sink."""
    port = free_port()
    log = tmp_path / f"standin-{port}.log"
    proc = spawn(["-m", "tests.weight_sync.standin_engine", str(port), vllm_api], log, {"OMP_NUM_THREADS": "1"})
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


@pytest.mark.parametrize(("kind", "vllm_api"), [("sglang", ""), ("vllm", "update"), ("vllm", "init")])
async def test_remote_sink_maps_requests_and_bytes_arrive(kind, vllm_api, tmp_path, redis_client):
    run = f"sink-{kind}"
    # the stand-in receives over a torch gloo group on CPU; a real vLLM server joins a PyNccl group (the
    # sidecar's default for vllm, tests/weight_sync/test_real_engines_gpu.py)
    async with standin_replica(tmp_path, redis_client, run, kind, vllm_api or "update", group="torch") as (
            engine, sidecar):
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
        else:
            # an older release refuses the packed parameters at init: one refused init, then per round
            assert calls.count("/init_weight_transfer_engine") == 1
            assert calls.count("/update_weights") == 2
            assert sidecar.sink.wire_at_init is (vllm_api == "init")
            assert calls.count("/start_weight_update") == calls.count("/finish_weight_update") == 2
        assert engine.pauses == 2


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
