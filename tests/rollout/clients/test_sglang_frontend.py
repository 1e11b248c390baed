"""SGLang 0.5.23's own frontend (``sgl.RuntimeEndpoint`` + an ``sgl.function`` program) gets its answers from a
FleetRL rollout service: one run, ``run_batch`` of 8 (which first caches the shared prefix with
``max_new_tokens=0``), a streamed run, and ``sgl.select`` (which scores each choice by its prompt logprobs:
``return_logprob`` with ``logprob_start_len``, ``input_token_logprobs``). Issue 37: main refused every one of its requests with 400
``sampling_params.spaces_between_special_tokens: unknown field``. The client runs in its own process
(``tests/rollout/clients/sglang_frontend.py``); its answers are checked against ``/generate`` called directly."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.procs import run_module
from tests.rollout.clients.sglang_frontend import CHOICES, PICK, PREFIX, QUESTIONS, STREAM_TOKENS

pytestmark = [pytest.mark.process, pytest.mark.slow]  # `import sglang` alone takes 20-60 s here


def _greedy(url: str, question: str, tokens: int = 4) -> str:
    body = {"text": PREFIX + question, "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                                           "ignore_eos": tokens != 4}}
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["text"]


@pytest.mark.timeout(600)  # `import sglang` (torch, transformers patches) took 23-60 s on a loaded 2-core machine
def test_sglang_frontend_program_single_batch_and_stream(rollout):
    proc = run_module(["-m", "tests.rollout.clients.sglang_frontend", rollout.url], timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["version"] == "0.5.23"
    expected = [_greedy(rollout.url, q) for q in QUESTIONS]
    assert all(expected), expected  # the tiny model answers something to every question
    assert out["single"] == expected[0]
    assert out["batch"] == expected
    assert "".join(out["stream_pieces"]) == out["stream"] == _greedy(rollout.url, QUESTIONS[0], STREAM_TOKENS)
    assert len(out["stream_pieces"]) >= 2  # streamed as it was generated, not in one piece
    # select: the choice with the best mean logprob of its tokens, each scored against /generate called directly
    scores = out["select_meta"]["normalized_prompt_logprobs"]
    assert out["select"] == CHOICES[scores.index(max(scores))] and len(set(scores)) == len(CHOICES)
    text = PREFIX + PICK
    tokens = httpx.post(f"{rollout.url}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 0}},
                        timeout=60).json()["meta_info"]["prompt_tokens"]
    for choice, got in zip(CHOICES, out["select_meta"]["input_token_logprobs"]):
        body = {"text": text + choice, "return_logprob": True, "logprob_start_len": tokens,
                "sampling_params": {"max_new_tokens": 0}}
        direct = httpx.post(f"{rollout.url}/generate", json=body, timeout=60).json()["meta_info"]
        # the client dropped the token it scored for healing (prompt_tokens - 2) when no healing happened
        assert [t[0] for t in got[-len(direct["input_token_logprobs"]):]] == pytest.approx(
            [t[0] for t in direct["input_token_logprobs"]], abs=1e-5)
