"""Real engines on a GPU (``make test-gpu``): the hf engine on CUDA, and SGLang / vLLM servers launched
as their own processes on a locally built small model, driven through FleetRL's rollout service.

Skipped where the engine package is missing. Logprob agreement is checked against a transformers
forward pass at the same temperature (bf16 engines: loose tolerance).
"""

from __future__ import annotations

import importlib.util

import httpx
import pytest

from shared.ports import free_port
from tests.procs import spawn, stop, wait_http_ok
from tests.rollout.conftest import start_rollout

pytestmark = pytest.mark.gpu


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    if not _cuda():
        pytest.skip("no CUDA GPU")
    from deploy.local.tiny_model import build_tiny_causal_lm

    # head_dim 64: the shape GPU attention kernels support
    return build_tiny_causal_lm(tmp_path_factory.mktemp("gpu-lm"), hidden_size=256, layers=2, heads=4)


def forward_logprobs(model_dir, prompt_ids, out_ids, temperature):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + out_ids]).cuda()).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(out_ids).cuda()[:, None])[:, 0].cpu()


def check_generate(url, model_dir, atol):
    import torch

    body = {"input_ids": [[10, 20, 30, 40], [50, 60]], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 16, "temperature": 0.8, "ignore_eos": True, "n": 2}}
    items = httpx.post(f"{url}/generate", json=body, timeout=120).json()
    assert len(items) == 4
    for k, item in enumerate(items):
        prompt = body["input_ids"][k // 2]
        got = torch.tensor([t[0] for t in item["meta_info"]["output_token_logprobs"]])
        want = forward_logprobs(model_dir, prompt, item["output_ids"], 0.8)
        assert torch.allclose(got, want, atol=atol), (got - want).abs().max()


def test_hf_engine_on_cuda(gpu_model_dir, tmp_path):
    cfg = {"model": str(gpu_model_dir), "engine": {"kind": "hf", "device": "cuda", "dtype": "float32"}}
    proc, url, _ = start_rollout(tmp_path, "hf-cuda", cfg)
    try:
        check_generate(url, gpu_model_dir, atol=1e-3)
    finally:
        stop(proc)


ENGINE_SERVERS = {
    "sglang": lambda model, port: ["-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port),
                                   "--host", "127.0.0.1", "--mem-fraction-static", "0.3"],
    "vllm": lambda model, port: ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
                                 "--host", "127.0.0.1", "--gpu-memory-utilization", "0.3",
                                 "--logprobs-mode", "processed_logprobs"],
}


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_real_engine_server(kind, gpu_model_dir, tmp_path):
    if importlib.util.find_spec(kind) is None:
        pytest.skip(f"{kind} is not installed here")
    port = free_port()
    log = tmp_path / f"{kind}.log"
    server = spawn(ENGINE_SERVERS[kind](gpu_model_dir, port), log)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", server, timeout=600, log=log)
        cfg = {"model": str(gpu_model_dir), "engine": {"kind": kind, "base_url": f"http://127.0.0.1:{port}"}}
        proc, url, _ = start_rollout(tmp_path, f"rollout-{kind}", cfg)
        try:
            assert httpx.get(f"{url}/health", timeout=60).status_code == 200
            check_generate(url, gpu_model_dir, atol=5e-2)
        finally:
            stop(proc)
    finally:
        stop(server)

