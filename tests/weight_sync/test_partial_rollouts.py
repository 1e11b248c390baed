"""Partial rollouts through the real pieces: a rollout service process (hf engine, weight sidecar with
``pause_mode: partial``) streams one long generation while the publisher in this process publishes two
versions; the generation completes, and the versions it reports per token are the publishes it saw, each span's
logprobs those of its own version (issue 14)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch

from deploy.local.tiny_model import build_tiny_causal_lm
from services.learner.weights import WeightPublisher
from shared.ports import free_port
from shared.weight_sync import WeightSyncSettings
from tests.procs import spawn, stop, wait_http_ok
from tests.weight_sync.conftest import TOKEN, new_weights, wait_registered
from tests.weight_sync.test_publish_hf import FAST

pytestmark = pytest.mark.process  # a rollout service process

NEW = 1000
PROMPT = [1, 40, 50, 60]


def teacher_forced(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([PROMPT + ids])).logits.float(), dim=-1)
    positions = torch.arange(len(PROMPT) - 1, len(PROMPT) + len(ids) - 1)
    return logp[0, positions, torch.tensor(ids)]


async def test_a_streamed_generation_spans_two_publishes_and_reports_the_versions_it_saw(
        tmp_path, redis_server, redis_client):
    run = "partial"
    model_dir = build_tiny_causal_lm(tmp_path / "model", max_positions=1100)  # room for a long generation
    port = free_port()
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FLEETRL_ROLLOUT_WEIGHT_SIDECAR": "true",
           "FLEETRL_ROLLOUT_CONTROL_TOKEN": TOKEN, "FLEETRL_ROLLOUT_INCREMENTAL_STREAMING_OUTPUT": "true",
           "FLEETRL_ROLLOUT_WEIGHTS__PAUSE_MODE": "partial", "FLEETRL_ROLLOUT_WEIGHTS__HEARTBEAT_S": "0.3"}
    log = tmp_path / "rollout.log"
    proc = spawn(["-m", "services.rollout", "--model", str(model_dir), "--port", str(port), "--engine", "hf",
                  "--device", "cpu", "--redis-url", redis_server.url, "--run-name", run], log, env)
    chunks: list[dict] = []
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", proc, timeout=120, log=log)
        await wait_registered(redis_client, run, 1)

        async def stream() -> None:
            body = {"input_ids": PROMPT, "stream": True, "return_logprob": True,
                    "sampling_params": {"max_new_tokens": NEW, "temperature": 1.0, "ignore_eos": True}}
            async with (httpx.AsyncClient(timeout=300) as client,
                        client.stream("POST", f"http://127.0.0.1:{port}/generate", json=body) as r):
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[len("data: "):]))

        async def tokens_past(n: int) -> None:
            for _ in range(3000):
                if sum(len(c["output_ids"]) for c in chunks) >= n:
                    return
                assert not consumer.done(), "the generation ended before the publishes"
                await asyncio.sleep(0.01)
            raise AssertionError("the generation made no progress")

        # built before the stream starts: building one mid-stream took long enough on a loaded machine that the
        # generation's last 600 tokens were out before the second publish (CI, two workers: spans [0, 1])
        models = {seed: new_weights(model_dir, seed=seed) for seed in (1, 2)}
        consumer = asyncio.create_task(stream())
        async with WeightPublisher(redis_client, run, WeightSyncSettings(bucket_bytes=64 << 10, **FAST)) as pub:
            for seed, after in ((1, 100), (2, 400)):
                await tokens_past(after)
                version = await pub.publish(models[seed])
                assert pub.last_report.loaded, pub.last_report
                assert version == seed
        await asyncio.wait_for(consumer, 300)
    finally:
        stop(proc)

    ids = [t for c in chunks for t in c["output_ids"]]
    logprobs = torch.tensor([lp for c in chunks for lp, _, _ in c["meta_info"]["output_token_logprobs"]])
    final = chunks[-1]["meta_info"]
    assert len(ids) == len(logprobs) == NEW and final["finish_reason"]["type"] == "length"
    spans = final["weight_version_spans"]
    assert [v for _, v in spans] == [0, 1, 2] and 100 <= spans[1][0] < spans[2][0] < NEW, spans
    assert final["weight_version"] == "0"  # the oldest token's version
    # the tokens after each switch are scored by the version that was published, not by the one before it
    for version in (1, 2):
        start = spans[version][0]
        end = spans[version + 1][0] if version + 1 < len(spans) else NEW
        mine = teacher_forced(models[version], ids)[start:end]
        torch.testing.assert_close(logprobs[start:end], mine, atol=2e-3, rtol=0)
