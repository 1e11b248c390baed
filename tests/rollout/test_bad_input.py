"""Bad input gets a 4xx that says what is wrong (never a 500); limits answer 413 / 429 / 503."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.rollout.conftest import CONTROL_TOKEN, MAX_BODY, MAX_INFLIGHT

BAD = [
    ("/generate", b'{"text": "hi", ', 400, "not valid JSON"),
    ("/generate", b'[1, 2]', 400, "body"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "bogus": 1}}, 400, "sampling_params.bogus: unknown field"),
    ("/generate", {"text": "hi", "extra_top_level": True}, 400, "extra_top_level: unknown field"),
    ("/generate", {"text": ""}, 400, "empty"),
    ("/generate", {"text": ["a", ""]}, 400, "non-empty"),
    ("/generate", {"input_ids": []}, 400, "empty"),
    ("/generate", {"text": "hi", "input_ids": [1]}, 400, "exactly one"),
    ("/generate", {}, 400, "exactly one"),
    ("/generate", {"input_ids": [1, 99999]}, 400, "outside the vocabulary"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 100000}}, 400, "exceeds the context length"),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": -0.5}}, 400, "temperature"),
    ("/generate", {"text": "hi", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("/generate", {"text": "hi", "sampling_params": {"n": 0}}, 400, "n"),
    ("/generate", {"text": "hi", "sampling_params": {"stop": [""]}}, 400, "stop"),
    ("/generate", {"text": "hi", "logprob_start_len": 0}, 400, "logprob_start_len"),
    ("/generate", {"text": "hi", "return_hidden_states": True}, 400, "return_hidden_states=True is not supported"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "no_stop_trim": True},
     400, "no_stop_trim=True is not supported"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "n": 1000}}, 400, "over this server's limit"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 100000}, 400, "context length"),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "empty"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "presence_penalty": 1.0}, 400, "not supported"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": "tiny"}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400,
     "logprobs"),
]


@pytest.mark.parametrize("path,body,status,needle", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_request_gets_clear_4xx(rollout, path, body, status, needle):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{rollout.url}{path}", timeout=30, headers={"content-type": "application/json"}, **kw)
    assert r.status_code == status, r.text
    payload = r.json()
    assert needle in payload["detail"] and payload["error"]["message"] == payload["detail"]


def test_huge_body_is_413(rollout):
    r = httpx.post(f"{rollout.url}/generate", json={"text": "x" * (MAX_BODY + 10)}, timeout=30)
    assert r.status_code == 413 and "limit" in r.json()["detail"]


def test_huge_chunked_body_is_413(rollout):
    def chunks():
        yield b'{"text": "'
        for _ in range(MAX_BODY // 1024 + 2):
            yield b"y" * 1024
        yield b'"}'

    r = httpx.post(f"{rollout.url}/generate", content=chunks(), timeout=30, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_control_routes_need_the_token(rollout):
    assert httpx.post(f"{rollout.url}/pause_generation", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{rollout.url}/continue_generation", headers=wrong, timeout=10).status_code == 401
    ok = {"Authorization": f"Bearer {CONTROL_TOKEN}"}
    assert httpx.post(f"{rollout.url}/continue_generation", headers=ok, timeout=10).json()["success"] is True


async def test_over_capacity_is_429_with_retry_after(rollout):
    big = {"text": "fill", "sampling_params": {"max_new_tokens": 400, "n": 100, "ignore_eos": True, "temperature": 1.0}}
    async with httpx.AsyncClient(base_url=rollout.url, timeout=120) as c:
        first = asyncio.create_task(c.post("/generate", json=big))
        await asyncio.sleep(0.5)  # admitted: 100 of 160 slots taken
        second = await c.post("/generate", json={**big, "sampling_params": {**big["sampling_params"], "n": 80}})
        assert second.status_code == 429, second.text
        assert second.headers["retry-after"] == "1"
        assert "over capacity" in second.json()["detail"]
        too_big = await c.post("/generate", json={"text": ["a"] * 2, "sampling_params": {"n": MAX_INFLIGHT}})
        assert too_big.status_code == 400
        first.cancel()  # the client goes away: its 100 sequences are aborted and their slots freed
    async with httpx.AsyncClient(base_url=rollout.url, timeout=60) as c:
        for _ in range(100):
            m = (await c.get("/metrics")).text
            inflight = [ln for ln in m.splitlines() if ln.startswith("fleetrl_rollout_inflight_sequences ")]
            if inflight and float(inflight[0].split()[1]) == 0:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the abandoned request's sequences were not freed")
        ok = await c.post("/generate", json={**big, "sampling_params": {**big["sampling_params"], "n": 80, "max_new_tokens": 2}})
        assert ok.status_code == 200
