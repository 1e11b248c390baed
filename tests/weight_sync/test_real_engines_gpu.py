"""Weight sync into real engine servers on a GPU (``make test-gpu``): a FleetRL publisher (nccl) updates an
SGLang server (torch.distributed group, /update_weights_from_distributed) and a vLLM server (its native
weight transfer: PyNccl group, /update_weights) through FleetRL's rollout service and its sidecar.

Checked by behaviour: after the publish, the logprobs the engine reports for its own samples match a
transformers forward pass under the *new* weights, and no longer match the old ones.
"""

from __future__ import annotations

import importlib.util

import httpx
import pytest

from shared.ports import free_port
from tests.procs import spawn, stop, wait_http_ok
from tests.rollout.conftest import start_rollout
from tests.rollout.test_real_engines_gpu import ENGINE_SERVERS, forward_logprobs, gpu_model_dir  # noqa: F401
from tests.weight_sync.conftest import TOKEN, new_weights, wait_registered

pytestmark = pytest.mark.gpu

WEIGHT_TRANSFER = {  # what each server needs to accept weight updates from a trainer
    "sglang": ([], {}),
    "vllm": (["--weight-transfer-config", '{"backend": "nccl"}'], {"VLLM_SERVER_DEV_MODE": "1"}),
}


def sample_logprobs(url: str) -> tuple[list[int], list[int], list[float]]:
    prompt = [10, 20, 30, 40]
    body = {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0.8, "ignore_eos": True}}
    item = httpx.post(f"{url}/generate", json=body, timeout=120).json()
    return prompt, item["output_ids"], [t[0] for t in item["meta_info"]["output_token_logprobs"]]


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_publish_into_a_real_engine_server(kind, gpu_model_dir, tmp_path, redis_server, redis_client):  # noqa: F811
    import torch

    from services.learner.weights import WeightPublisher
    from shared.weight_sync import WeightSyncSettings

    if importlib.util.find_spec(kind) is None:
        pytest.skip(f"{kind} is not installed here")
    port = free_port()
    log = tmp_path / f"{kind}.log"
    extra_args, extra_env = WEIGHT_TRANSFER[kind]
    server = spawn([*ENGINE_SERVERS[kind](gpu_model_dir, port), *extra_args], log, extra_env)
    run = f"gpu-{kind}"
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", server, timeout=600, log=log)
        cfg = {"model": str(gpu_model_dir), "engine": {"kind": kind, "base_url": f"http://127.0.0.1:{port}"},
               "control_token": TOKEN, "weight_sidecar": True, "redis_url": redis_server.url, "run_name": run,
               "weights": {"backend": "nccl"}}
        proc, url, rlog = start_rollout(tmp_path, f"rollout-{kind}", cfg)
        try:
            await wait_registered(redis_client, run, 1, timeout=120)
            model = new_weights(gpu_model_dir, seed=3).cuda().to(torch.bfloat16)
            settings = WeightSyncSettings(backend="nccl", bucket_bytes=1 << 20, init_timeout_s=120,
                                          collective_timeout_s=120, load_timeout_s=120)
            async with WeightPublisher(redis_client, run, settings) as pub:
                assert await pub.publish(model) == 1
                assert len(pub.last_report.loaded) == 1, (pub.last_report, rlog.read_text()[-3000:])
            async with httpx.AsyncClient(timeout=30) as client:
                assert (await client.get(f"{url}/model_info")).json()["weight_version"] == "1"
            prompt, out, got = sample_logprobs(url)
            new_dir = tmp_path / "new"
            model.float().save_pretrained(new_dir)
            want_new = forward_logprobs(new_dir, prompt, out, 0.8)
            want_old = forward_logprobs(gpu_model_dir, prompt, out, 0.8)
            got_t = torch.tensor(got)
            assert torch.allclose(got_t, want_new, atol=1e-1), (got_t - want_new).abs().max()
            assert (got_t - want_old).abs().max() > 0.2  # the engine really serves the new weights
        finally:
            stop(proc)
    finally:
        stop(server)
