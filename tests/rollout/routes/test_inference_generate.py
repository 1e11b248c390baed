"""``POST /inference/v1/generate`` speaks vLLM's token-in / token-out protocol exactly as its clients read it (the
checks the renderers / verifiers training client makes on a reply), and bad input is a 400 naming the field."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from tests.rollout.routes.conftest import AUTH
from tests.rollout.routes.test_sessions_openai import create, finish, pushed

PROMPT = [3, 89, 87, 73, 86, 203, 76, 73]


def gen(url: str, headers: dict | None = None, **body) -> httpx.Response:
    payload = {"model": "tiny", "token_ids": PROMPT, "sampling_params": {"max_tokens": 6, "temperature": 1.0}}
    payload.update(body)
    return httpx.post(f"{url}/inference/v1/generate", json=payload, headers=headers, timeout=60)


def check_choice(choice: dict, k: int | None) -> None:
    """What renderers.client checks: one entry per token, token 'token_id:<id>', finite logprob <= 0, and with a
    head of k the sampled token first then k - 1 others."""
    ids = choice["token_ids"]
    content = choice["logprobs"]["content"]
    assert len(content) == len(ids) >= 1
    for tid, entry in zip(ids, content):
        assert entry["token"] == f"token_id:{tid}"
        assert math.isfinite(entry["logprob"]) and -9999.0 <= entry["logprob"] <= 1e-6
        head = entry["top_logprobs"]
        assert head[0] == {"token": f"token_id:{tid}", "logprob": entry["logprob"], "bytes": None}
        assert len(head) == max(k or 1, 1)
        assert len({h["token"] for h in head}) == len(head)


def test_models_card_carries_max_model_len(rollout):
    card = httpx.get(f"{rollout.url}/v1/models", timeout=10).json()["data"][0]
    assert card["id"] == "tiny" and card["max_model_len"] == 512


@pytest.mark.parametrize("logprobs", [1, 5])
def test_reply_shape(rollout, logprobs):
    r = gen(rollout.url, sampling_params={"max_tokens": 6, "logprobs": logprobs, "skip_special_tokens": False,
                                          "stop_token_ids": [2]}, cache_salt="salt", priority=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["request_id"].startswith("generate-tokens-")
    assert body["prompt_token_ids"] is None  # only with return_token_ids, as vLLM
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length")
    check_choice(choice, logprobs)
    assert body["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": len(choice["token_ids"]),
                             "total_tokens": len(PROMPT) + len(choice["token_ids"])}


def test_greedy_matches_sglang_generate_and_n(rollout):
    r = gen(rollout.url, sampling_params={"max_tokens": 5, "temperature": 0, "logprobs": 1, "ignore_eos": True, "n": 2},
            return_token_ids=True)
    body = r.json()
    assert body["prompt_token_ids"] == PROMPT and len(body["choices"]) == 2
    ref = httpx.post(f"{rollout.url}/generate", json={"input_ids": PROMPT, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}, timeout=60).json()
    for choice in body["choices"]:
        assert choice["token_ids"] == ref["output_ids"] and choice["finish_reason"] == "length"
        got = [e["logprob"] for e in choice["logprobs"]["content"]]
        assert got == pytest.approx([lp for lp, _, _ in ref["meta_info"]["output_token_logprobs"]], abs=1e-5)


def test_no_logprobs_means_none_and_max_tokens_defaults_to_the_context(rollout):
    body = gen(rollout.url, sampling_params={"temperature": 0, "max_tokens": 3}).json()
    assert body["choices"][0]["logprobs"] is None
    # left out, max_tokens is the rest of the context (vLLM's server default), not 16
    r = gen(rollout.url, token_ids=[5] * 505, sampling_params={"temperature": 0, "ignore_eos": True})
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 512 - 505


def test_streaming(rollout):
    with httpx.stream("POST", f"{rollout.url}/inference/v1/generate", timeout=60, json={
            "token_ids": PROMPT, "stream": True, "stream_options": {"include_usage": True},
            "sampling_params": {"max_tokens": 4, "temperature": 0, "logprobs": 1, "ignore_eos": True}}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ids = [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]]
    full = gen(rollout.url, sampling_params={"max_tokens": 4, "temperature": 0, "ignore_eos": True}).json()
    assert ids == full["choices"][0]["token_ids"]
    assert chunks[-1]["usage"]["completion_tokens"] == 4 and chunks[-1]["choices"] == []
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["length"]


def test_unknown_fields_are_ignored_as_vllm_does(rollout):
    r = gen(rollout.url, some_router_field=1, sampling_params={"max_tokens": 2, "flat_logprobs": True,
                                                                "extra_args": {"prl_compact_logprobs": True},
                                                                "detokenize": False, "not_a_vllm_field": 3})
    assert r.status_code == 200, r.text
    assert "compact_logprobs" not in r.json()["choices"][0]  # the extension is not served: clients fall back to JSON


@pytest.mark.parametrize("body, says", [
    ({"token_ids": []}, "token_ids"),
    ({"token_ids": [1, -1]}, "token ids are integers"),
    ({"token_ids": [10**6]}, "outside the vocabulary"),
    ({"token_ids": "hello"}, "token_ids"),
    ({"sampling_params": {"max_tokens": 0}}, "max_tokens"),
    ({"sampling_params": {"max_tokens": 600}}, "exceeds the context length"),
    ({"sampling_params": {"temperature": -1}}, "temperature"),
    ({"sampling_params": {"presence_penalty": 2.5}}, "presence_penalty"),
    ({"sampling_params": {"logit_bias": {"3": 1.0}}}, "logit_bias"),
    ({"sampling_params": {"logprobs": 50}}, "logprobs"),
    ({"sampling_params": {"structured_outputs": {"choice": ["a"]}}}, "structured_outputs.choice"),
    ({"priority": 1}, "priority"),
    ({"model": "other"}, "not served here"),
])
def test_bad_input_is_a_clear_4xx(rollout, body, says):
    r = gen(rollout.url, **body)
    assert r.status_code in (400, 404), r.text
    assert says in r.json()["error"]["message"]


def test_missing_sampling_params_is_400(rollout):
    r = httpx.post(f"{rollout.url}/inference/v1/generate", json={"token_ids": PROMPT}, timeout=10)
    assert r.status_code == 400 and "sampling_params" in r.json()["error"]["message"]


def test_session_header_is_a_hint_when_sessions_are_off(rollout):
    assert gen(rollout.url, headers={"X-Session-ID": "anything"}).status_code == 200


def test_session_header_records_the_call(session_rollout, redis_server):
    sid = create(session_rollout.url, prompt_id="tito-task")
    first = gen(session_rollout.url, headers={"X-Session-ID": sid, **AUTH},
                sampling_params={"max_tokens": 4, "logprobs": 1, "ignore_eos": True}).json()["choices"][0]
    env = [70, 71]
    second = gen(session_rollout.url, headers={"X-Session-ID": sid, **AUTH}, token_ids=PROMPT + first["token_ids"] + env,
                 sampling_params={"max_tokens": 3, "logprobs": 1, "ignore_eos": True}).json()["choices"][0]
    finish(session_rollout.url, sid, reward=0.25)
    exp = pushed(redis_server.url)["tito-task#0"]
    assert list(exp.prompt_token_ids) == PROMPT
    assert list(exp.response_token_ids) == first["token_ids"] + env + second["token_ids"]
    assert list(exp.action_mask) == [1] * 4 + [0] * 2 + [1] * 3
    lps = [e["logprob"] for e in first["logprobs"]["content"]] + [0.0, 0.0] + \
          [e["logprob"] for e in second["logprobs"]["content"]]
    assert list(exp.response_logprobs) == pytest.approx(lps, abs=1e-5)
