"""Bad input gets a 4xx that says what is wrong (never a 500); limits answer 413 / 429 / 503."""

from __future__ import annotations

import asyncio
import json

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
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": -2}, 400, "logprob_start_len"),
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": 3}, 400, "logprob_start_len=3: more than"),
    ("/generate", {"text": "hi", "return_hidden_states": True}, 400, "return_hidden_states=True is not supported"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "no_stop_trim": True},
     400, "no_stop_trim=True is not supported"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "n": 1000}}, 400, "over this server's limit"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 100000}, 400, "context length"),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "empty"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"5": 1.0}}, 400, "not supported by the `hf` engine"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty"),
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


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
CMPL = {"model": "tiny", "prompt": "x"}
INF, NAN = float("inf"), float("nan")

# Numbers an engine cannot hold, numbers sent as strings, non-finite floats, text that is not UTF-8 (a lone
# surrogate, as JSON's "\ud800" escape decodes to): each a 400 naming the field, at every route.
OUT_OF_RANGE = [
    ("/generate", {"text": "a", "sampling_params": {"top_k": 1e20}}, "sampling_params.top_k"),
    ("/generate", {"text": "a", "sampling_params": {"top_k": 2**70}}, "sampling_params.top_k"),
    ("/generate", {"text": "a", "sampling_params": {"top_k": "5"}}, "sampling_params.top_k"),
    ("/generate", {"text": "a", "sampling_params": {"sampling_seed": 2**70}}, "sampling_params.sampling_seed"),
    ("/generate", {"text": "a", "sampling_params": {"sampling_seed": 2**63}}, "sampling_params.sampling_seed"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": "10"}}, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2.5}}, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2**70}}, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": INF}}, "sampling_params.temperature"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": NAN}}, "sampling_params.temperature"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": "1"}}, "sampling_params.temperature"),
    ("/generate", {"text": "a", "sampling_params": {"top_p": NAN}}, "sampling_params.top_p"),
    ("/generate", {"text": "a", "sampling_params": {"min_p": INF}}, "sampling_params.min_p"),
    ("/generate", {"text": "a", "sampling_params": {"n": "2"}}, "sampling_params.n"),
    ("/generate", {"text": "a", "sampling_params": {"ignore_eos": "false"}}, "sampling_params.ignore_eos"),
    ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": [2**40]}}, "sampling_params.stop_token_ids"),
    ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": ["1"]}}, "sampling_params.stop_token_ids"),
    ("/generate", {"text": "a", "sampling_params": {"stop": ["\ud800"]}}, "sampling_params.stop"),
    ("/generate", {"input_ids": [1, 2**40]}, "input_ids"),
    ("/generate", {"input_ids": [[1], [2, 2**70]]}, "input_ids"),
    ("/generate", {"input_ids": [1, "2"]}, "input_ids"),
    ("/generate", {"input_ids": [1, 2.0]}, "input_ids"),
    ("/generate", {"text": "\ud800 x"}, "text"),
    ("/generate", {"text": ["fine", "x \udfff"]}, "text"),
    ("/generate", {"text": "a", "rid": "\ud800"}, "rid"),
    ("/generate", {"text": "a", "\ud800": 1}, "body: holds text that is not valid UTF-8"),  # a field name
    ("/generate", {"text": "a", "top_logprobs_num": "2"}, "top_logprobs_num"),
    ("/generate", {"text": "a", "return_logprob": "yes"}, "return_logprob"),
    ("/v1/completions", {**CMPL, "seed": 2**70}, "seed"),
    ("/v1/completions", {**CMPL, "max_tokens": "10"}, "max_tokens"),
    ("/v1/completions", {**CMPL, "temperature": INF}, "temperature"),
    ("/v1/completions", {**CMPL, "top_k": 1e20}, "top_k"),
    ("/v1/completions", {**CMPL, "logprobs": 2**70}, "logprobs"),
    ("/v1/completions", {**CMPL, "n": 1.0}, "n"),
    ("/v1/completions", {**CMPL, "presence_penalty": NAN}, "presence_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": [1, 2**40]}, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "\ud800 x"}, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": ["ok", "\ud800"]}, "prompt"),
    ("/v1/completions", {**CMPL, "stop": "\udc00"}, "stop"),
    ("/v1/chat/completions", {**CHAT, "seed": 2**70}, "seed"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": "5"}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 1e20, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "temperature": -INF}, "temperature"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "\ud800 x"}]},
     "messages.0.content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "\ud800"}]}]}, "messages.0.content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x", "name": "\ud800"}]},
     "messages.0.name"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "\ud800"}}]}, "tools"),
]


def _raw(body: dict) -> bytes:
    """JSON as a client that can send anything sends it: Infinity / NaN literals, \\ud800 escapes."""
    return json.dumps(body).encode()


@pytest.mark.parametrize("path,body,field", OUT_OF_RANGE, ids=[f"{b[0]}-{b[2]}-{i}" for i, b in enumerate(OUT_OF_RANGE)])
def test_out_of_range_values_are_a_400_naming_the_field(rollout, path, body, field):
    with httpx.Client(base_url=rollout.url, timeout=30, headers={"content-type": "application/json"}) as c:
        r = c.post(path, content=_raw(body))
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert detail.startswith(field) or f"; {field}" in detail, detail
        # the connection survives a 4xx: the next request on it is served
        assert c.get("/health").status_code == 200


STILL_ACCEPTED = [
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2, "temperature": 1, "top_p": 1, "min_p": 0,
                                                     "sampling_seed": 2**63 - 1, "n": 2, "top_k": 2**31 - 1}}),
    ("/generate", {"text": "a \ud83d\ude00", "sampling_params": {"max_new_tokens": 2}}),  # a surrogate *pair* is fine
    ("/v1/completions", {**CMPL, "max_tokens": 2, "temperature": 0, "seed": 2**63 - 1, "top_p": 1}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 2, "temperature": 2, "seed": 0, "logprobs": True,
                              "top_logprobs": 1}),
]


@pytest.mark.parametrize("path,body", STILL_ACCEPTED, ids=[b[0] for b in STILL_ACCEPTED])
def test_ints_where_floats_are_declared_and_edge_values_still_work(rollout, path, body):
    r = httpx.post(f"{rollout.url}{path}", content=_raw(body), timeout=60, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


async def test_a_bad_request_never_aborts_another_clients_generation(rollout):
    """Issue 17 #4: one request with an overflowing ``top_k`` used to abort every sequence in the hf decode batch."""
    good = {"text": "keep going", "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "n": 3}}
    bads = [{"text": "a", "sampling_params": {"top_k": 2**70}}, {"text": "a", "sampling_params": {"top_k": 1e20}},
            {"text": "a", "sampling_params": {"sampling_seed": 2**70}}, {"text": "\ud800 x"}]
    finishes, statuses = {}, []
    async with httpx.AsyncClient(base_url=rollout.url, timeout=120) as c, c.stream("POST", "/generate", json=good) as r:
        lines = r.aiter_lines()
        async for line in lines:  # the good sequences are decoding
            if line.startswith("data: {"):
                break
        for bad in bads:
            async with httpx.AsyncClient(base_url=rollout.url, timeout=60) as other:
                reply = await other.post("/generate", content=_raw(bad), headers={"content-type": "application/json"})
                statuses.append(reply.status_code)
        async for line in lines:
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["meta_info"]["finish_reason"] is not None:
                    finishes[chunk["index"]] = chunk["meta_info"]["finish_reason"]
    assert finishes == {i: {"type": "length", "length": 400} for i in range(3)}
    assert statuses == [400] * len(bads)


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
