"""``python -m deploy.gpu.engine_bench MODEL``: the hf engine's generation throughput through the rollout
service (one batched ``/generate`` of 64 sequences x 128 new tokens) against plain ``model.generate`` of the same
batch in one process, on the GPU, bf16 both. Prints tokens/s of each and the ratio."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from shared.ports import free_port

BATCH, NEW, PROMPT = 128, 48, "sort 3721="  # the recipe model's context is 64 tokens


def _wait_ok(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the rollout service exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s: {log.read_text()[-2000:]}")


def service_tokens_per_s(model: str) -> float:
    port = free_port()
    log = Path(os.environ.get("GPU_CHECK_DIR", "runs/gpu-check")) / "engine-service.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FLEETRL_ROLLOUT_WEIGHTS__ENABLED": "false", "FLEETRL_ROLLOUT_ENGINE__MAX_BATCH_SIZE": str(BATCH)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "services.rollout", "--model", model, "--port", str(port),
                                 "--engine", "hf", "--device", "cuda"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ok(f"http://127.0.0.1:{port}/health", proc, 180, log)
        body = {"text": [PROMPT] * BATCH, "sampling_params": {"max_new_tokens": NEW, "temperature": 1.0,
                                                                "ignore_eos": True}}
        best = 0.0
        for _ in range(4):  # the first warms up
            t0 = time.perf_counter()
            r = httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=300)
            r.raise_for_status()
            tokens = sum(len(x["output_ids"]) for x in r.json())
            best = max(best, tokens / (time.perf_counter() - t0))
        return best
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def plain_tokens_per_s(model: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).cuda().eval()
    ids = torch.tensor([tok.encode(PROMPT, add_special_tokens=False)] * BATCH, device="cuda")
    best = 0.0
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=True, temperature=1.0, pad_token_id=tok.pad_token_id)
        torch.cuda.synchronize()
        best = max(best, (out.shape[1] - ids.shape[1]) * BATCH / (time.perf_counter() - t0))
    return best


def main() -> int:
    model = sys.argv[1]
    served = service_tokens_per_s(model)
    plain = plain_tokens_per_s(model)
    print(f"batch {BATCH} x {NEW} new tokens, bf16: rollout service (hf engine) {served:,.0f} tok/s, "
          f"model.generate in one process {plain:,.0f} tok/s, ratio {served / plain:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
