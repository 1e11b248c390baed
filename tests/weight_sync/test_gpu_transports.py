"""Weights on a GPU, on every transport that can carry them (``make gpu-check`` runs these):

- ``ipc``: a replica process on the learner's own GPU takes each version device to device by CUDA IPC
  handle; its log-probabilities equal the learner's within 2e-3, version after version;
- gloo and snapshot: the learner's in-place CUDA buckets are staged through pinned host memory (they used to
  reach gloo as CUDA tensors, and numpy in the snapshot writer) and a CPU replica loads them;
- delta rounds from CUDA buckets: compared on the GPU, the patches staged to the host for gloo, CPU replicas
  bit-equal to the learner's bytes after every round.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import torch

from services.learner.weights import WeightPublisher
from shared.weight_sync import WeightSyncSettings
from tests.procs import spawn, stop
from tests.weight_sync.conftest import PROMPT, reference_ids, wait_registered

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

IDS = [5, 17, 42, 99, 120, 7, 33, 64, 200, 11, 150, 77]

RECEIVER = r'''
import asyncio, json, sys, torch, redis.asyncio as aioredis
sys.path.insert(0, ".")
from transformers import AutoModelForCausalLM
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar

IDS = __IDS__

class Engine:
    kind, weight_sink = "hf", "services.rollout.weights.sinks.hf:HFSink"
    def __init__(self, path):
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
        self.weight_version = 0
    def set_weight_version(self, v): self.weight_version = v
    async def pause(self, mode="wait", timeout=None): pass
    async def resume(self): pass

def logprobs(model):
    ids = torch.tensor([IDS], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits.float()
    lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp.tolist()

async def main():
    r = aioredis.from_url(sys.argv[1])
    eng = Engine(sys.argv[2])
    sc = WeightSidecar(eng, r, "ipc", SidecarSettings(transport="ipc", join_timeout_s=0, heartbeat_s=0.3,
                                                      heartbeat_ttl_s=3))
    await sc.start()
    seen = 0
    while seen < 2:
        await asyncio.sleep(0.05)
        if eng.weight_version > seen:
            seen = eng.weight_version
            await r.set(f"ipc:lp:{seen}", json.dumps(logprobs(eng.model)))
            await r.set(f"ipc:update:{seen}", json.dumps(sc.status()["last_update"].model_dump()))
    await asyncio.sleep(1)
    await sc.stop()

asyncio.run(main())
'''.replace("__IDS__", repr(IDS))


def learner_logprobs(model) -> list[float]:
    ids = torch.tensor([IDS], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


async def wait_key(redis, key: str, timeout: float = 120.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while (raw := await redis.get(key)) is None:
        assert asyncio.get_running_loop().time() < deadline, f"{key} never written"
        await asyncio.sleep(0.1)
    return json.loads(raw)


async def test_ipc_replica_on_the_learners_gpu_matches_its_logprobs(tmp_path, redis_server, redis_client,
                                                                     tiny_model_dir):
    from transformers import AutoModelForCausalLM

    script = tmp_path / "recv.py"
    script.write_text(RECEIVER)
    proc = spawn([str(script), redis_server.url, str(tiny_model_dir)], tmp_path / "recv.log")
    try:
        await wait_registered(redis_client, "ipc", 1, timeout=120)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).cuda().eval()
        settings = WeightSyncSettings(bucket_bytes=64 << 10, load_timeout_s=60)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        async with WeightPublisher(redis_client, "ipc", settings) as pub:
            assert pub.flatten(model) > 1  # in place: the buckets ARE the weights, shared without a copy
            for version in (1, 2):
                torch.manual_seed(version)
                for p in model.parameters():  # a "training step" that moves every weight
                    p.grad = torch.randn_like(p) * 0.2
                opt.step()
                assert await pub.publish(model) == version
                report = pub.last_report
                assert report.loaded and not report.errors, report
                assert pub.outbox.manifest.checksum == "wsum64"  # digested on the GPU
                theirs = await wait_key(redis_client, f"ipc:lp:{version}")
                mine = learner_logprobs(model)
                assert max(abs(a - b) for a, b in zip(mine, theirs)) < 2e-3, (mine, theirs)
                update = await wait_key(redis_client, f"ipc:update:{version}")
                assert update["source"] == "ipc" and update["state"] == "loaded", update
    finally:
        stop(proc)
        print((tmp_path / "recv.log").read_text()[-3000:], file=sys.stderr)


@pytest.mark.parametrize("transport", ["collective", "snapshot"])
async def test_cuda_weights_reach_a_cpu_replica_through_pinned_host_staging(transport, replicas, redis_client,
                                                                             tiny_model_dir, tmp_path):
    from tests.weight_sync.conftest import new_weights

    run = f"gpu-{transport}"
    extra = {"TRANSPORT": transport} if transport == "snapshot" else {}
    rep = replicas(run, **extra)
    await wait_registered(redis_client, run, 1, timeout=60)
    cpu = new_weights(tiny_model_dir, seed=3)
    model = new_weights(tiny_model_dir, seed=3).cuda()
    settings = WeightSyncSettings(backend="gloo", bucket_bytes=64 << 10,
                                  snapshot_dir=str(tmp_path / "snap") if transport == "snapshot" else None)
    async with WeightPublisher(redis_client, run, settings) as pub:
        pub.flatten(model)  # in-place CUDA buckets: what the learner publishes by default on a GPU
        assert await pub.publish(model) == 1
        assert not pub.last_report.errors, pub.last_report
    for _ in range(200):
        if rep.weight_version() >= 1:
            break
        await asyncio.sleep(0.1)
    assert rep.weight_version() == 1
    assert rep.generate()["output_ids"] == reference_ids(cpu, tiny_model_dir)
    assert PROMPT


async def test_a_cuda_learners_delta_rounds_leave_cpu_replicas_bit_equal(replicas, redis_client, tiny_model_dir):
    # the learner's base and the compare live on the GPU (diff_device), the patch goes to the host for gloo; a
    # wrong patch would be refused by the replicas' digest check and resent whole, which `kinds` would show
    from tests.weight_sync.conftest import new_weights
    from tests.weight_sync.test_delta_rounds import assert_bit_equal, kinds, nudge
    from tests.weight_sync.test_publish_hf import FAST

    run = "gpu-delta"
    a, b = replicas(run), replicas(run)
    await wait_registered(redis_client, run, 2, timeout=60)
    model = new_weights(tiny_model_dir).cuda()
    settings = WeightSyncSettings(bucket_bytes=64 << 10, delta="on", **FAST)
    async with WeightPublisher(redis_client, run, settings) as pub:
        pub.flatten(model)  # in-place CUDA buckets, as the learner publishes on a GPU
        assert await pub.publish(model) == 1
        assert kinds(pub) == {"full"} and len(pub.last_report.loaded) == 2, pub.last_report
        assert pub.delta.buffers and all(buf.device.type == "cuda" for buf in pub.delta.buffers)
        full_bytes = pub.last_report.round_bytes["full"]
        for step in range(4):
            nudge(model, step)
            await pub.publish(model)
            report = pub.last_report
            assert kinds(pub) == {"delta"} and len(report.loaded) == 2 and not report.errors, report
            assert report.round_bytes["delta"] < 0.2 * full_bytes, report.round_bytes
            host = new_weights(tiny_model_dir)
            host.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
            await assert_bit_equal(pub, host, [a, b])
