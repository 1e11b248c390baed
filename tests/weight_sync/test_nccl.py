"""NCCL between GPUs: the same protocol, backend nccl (publisher and a receiver process on one GPU host)."""

from __future__ import annotations

import sys

import pytest
import torch

from services.learner.weights import WeightPublisher
from shared.weight_sync import WeightSyncSettings
from tests.procs import spawn, stop
from tests.weight_sync.conftest import wait_registered

pytestmark = pytest.mark.gpu

RECEIVER = r'''
import asyncio, sys, torch, redis.asyncio as aioredis
sys.path.insert(0, ".")
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar

class Engine:
    kind, weight_sink = "hf", "services.rollout.weights.sinks.hf:HFSink"
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]).to("cuda:1").to(torch.bfloat16)
        self.weight_version = 0
    def set_weight_version(self, v): self.weight_version = v
    async def pause(self, mode="wait", timeout=None): pass
    async def resume(self): pass

async def main():
    r = aioredis.from_url(sys.argv[1])
    eng = Engine()
    sc = WeightSidecar(eng, r, "nccl", SidecarSettings(backend="nccl", join_timeout_s=0))
    await sc.start()
    while eng.weight_version < 1:
        await asyncio.sleep(0.1)
    total = sum(float(p.float().sum()) for p in eng.model.parameters())
    await r.set("nccl:sum", repr(total))
    await asyncio.sleep(2)
    await sc.stop()

asyncio.run(main())
'''


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="needs two GPUs: NCCL never pairs two ranks on one GPU (one GPU: the ipc transport, "
                           "tests/weight_sync/test_gpu_transports.py)")
async def test_nccl_publish_to_gpu_receiver(tmp_path, redis_server, redis_client):
    script = tmp_path / "recv.py"
    script.write_text(RECEIVER)
    proc = spawn([str(script), redis_server.url], tmp_path / "recv.log")
    try:
        await wait_registered(redis_client, "nccl", 1, timeout=120)
        torch.manual_seed(1)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]).cuda().to(torch.bfloat16)
        settings = WeightSyncSettings(backend="nccl", bucket_bytes=256 << 10, init_timeout_s=120,
                                      collective_timeout_s=60, load_timeout_s=60)
        async with WeightPublisher(redis_client, "nccl", settings) as pub:
            assert await pub.publish(model) == 1
            assert len(pub.last_report.loaded) == 1, pub.last_report
        expect = sum(float(p.float().sum()) for p in model.parameters())
        for _ in range(100):
            got = await redis_client.get("nccl:sum")
            if got:
                break
            import asyncio
            await asyncio.sleep(0.1)
        assert got is not None and abs(float(got) - expect) < 1e-2, (got, expect)
    finally:
        stop(proc)
        print((tmp_path / "recv.log").read_text()[-3000:], file=sys.stderr)
