"""SGLang-style /generate against the real service process: single, batch, n, stream, logprobs, stops, seeds."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def post(server, body, timeout=60.0):
    return httpx.post(f"{server.url}/generate", json=body, timeout=timeout)


@pytest.fixture(scope="module")
def reference(rollout):
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(rollout.model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(rollout.model_dir)


def test_single_text(rollout):
    r = post(rollout, {"text": "The answer is", "sampling_params": {"max_new_tokens": 6, "temperature": 0},
                       "return_logprob": True})
    assert r.status_code == 200, r.text
    body = r.json()
    meta = body["meta_info"]
    assert len(body["output_ids"]) == meta["completion_tokens"] <= 6
    assert meta["prompt_tokens"] == len("The answer is")  # byte-level tokenizer, no BOS
    assert meta["weight_version"] == "0" and isinstance(meta["id"], str)
    assert meta["finish_reason"]["type"] in ("length", "stop")
    assert [t[1] for t in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(t[2] is None and t[0] <= 0 for t in meta["output_token_logprobs"])


def test_batch_input_ids_and_n(rollout):
    body = {"input_ids": [[72, 101, 108], [87, 111, 114, 108, 100]],
            "sampling_params": {"max_new_tokens": 4, "n": 3, "temperature": 1.0, "ignore_eos": True}}
    r = post(rollout, body)
    assert r.status_code == 200, r.text
    items = r.json()
    assert isinstance(items, list) and len(items) == 6
    assert [it["meta_info"]["prompt_tokens"] for it in items] == [3, 3, 3, 5, 5, 5]  # prompt-major
    assert all(len(it["output_ids"]) == 4 and it["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
               for it in items)
    assert len({it["meta_info"]["id"] for it in items}) == 6


def test_stream_is_sse_and_matches_final(rollout):
    body = {"text": "Once upon", "stream": True, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}
    with httpx.stream("POST", f"{rollout.url}/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[5:]) for ln in lines[:-1]]
    assert len(chunks) == 5  # one per token, cumulative like SGLang
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    final = post(rollout, {**body, "stream": False}).json()
    assert final["output_ids"] == chunks[-1]["output_ids"]  # greedy: same tokens either way
    assert final["text"] == chunks[-1]["text"]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_forward_pass(rollout, reference, temperature):
    model, tok = reference
    prompts = ["Hello there", "A much longer prompt to force left padding in the batch", "x"]
    body = {"text": prompts, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 12, "temperature": temperature, "ignore_eos": True, "sampling_seed": 7}}
    items = post(rollout, body).json()
    for prompt, item in zip(prompts, items):
        ids = tok.encode(prompt)
        out = item["output_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1].float()
        scale = temperature if temperature > 0 else 1.0
        expected = torch.log_softmax(logits / scale, dim=-1).gather(-1, torch.tensor(out)[:, None])[:, 0]
        got = torch.tensor([t[0] for t in item["meta_info"]["output_token_logprobs"]])
        assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
        if temperature == 0:
            assert out == logits.argmax(-1).tolist()


def test_seeded_sampling_is_reproducible(rollout):
    body = {"text": ["seed me", "and me"], "sampling_params": {"max_new_tokens": 8, "temperature": 1.0,
                                                                 "sampling_seed": 123, "ignore_eos": True, "n": 2}}
    a, b = post(rollout, body).json(), post(rollout, body).json()
    assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b]
    assert a[0]["output_ids"] != a[1]["output_ids"]  # sample j uses seed + j


def test_stop_token_ids_and_stop_strings(rollout):
    base = {"text": "stop test", "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
    free = post(rollout, base).json()
    ids, text = free["output_ids"], free["text"]
    # stop on the 3rd generated token id (first occurrence)
    target = ids[2]
    first = ids.index(target)
    r = post(rollout, {**base, "sampling_params": {**base["sampling_params"], "stop_token_ids": [target]}}).json()
    assert r["output_ids"] == ids[: first + 1]
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    # stop string: a printable piece of the greedy text
    visible = [i for i, ch in enumerate(text) if ch.isprintable() and ch != "\ufffd"]
    if len(visible) >= 2:
        stop = text[visible[1]]
        r = post(rollout, {**base, "sampling_params": {**base["sampling_params"], "stop": [stop]}}).json()
        assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert r["text"] == text[: text.index(stop)]
        assert stop not in r["text"]
        assert ids[: len(r["output_ids"])] == r["output_ids"]  # same tokens, cut where the stop string appeared
        kept = post(rollout, {**base, "sampling_params": {**base["sampling_params"], "stop": [stop], "no_stop_trim": True}}).json()
        assert kept["text"].endswith(stop)


def test_model_info_health_metrics(rollout):
    info = httpx.get(f"{rollout.url}/model_info", timeout=10).json()
    assert info["weight_version"] == "0" and info["engine"] == "hf" and info["model_path"] == str(rollout.model_dir)
    health = httpx.get(f"{rollout.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    metrics = httpx.get(f"{rollout.url}/metrics", timeout=10).text
    for name in ("fleetrl_rollout_requests_total", "fleetrl_rollout_generated_tokens_total",
                 "fleetrl_rollout_queue_depth", "fleetrl_rollout_batch_size_bucket",
                 "fleetrl_rollout_request_latency_seconds_bucket"):
        assert name in metrics


def test_sglang_schema_fields_at_neutral_values_are_accepted(rollout):
    """sglang-router re-sends SGLang's whole request schema; neutral values must not be refused."""
    base = {"text": "The answer is", "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    plain = post(rollout, base).json()
    routed = post(rollout, {**base, "model": "anything", "log_metrics": True, "no_logs": False,
                            "return_hidden_states": False, "return_entropy": False, "return_bytes": False,
                            "background": False})
    assert routed.status_code == 200, routed.text
    assert routed.json()["output_ids"] == plain["output_ids"]
    chat = httpx.post(f"{rollout.url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "separate_reasoning": True, "stream_reasoning": True, "no_stop_trim": False, "return_hidden_states": False})
    assert chat.status_code == 200, chat.text


def test_openai_routes_accept_sglang_extras_at_neutral_values(rollout):
    r = httpx.post(f"{rollout.url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": "hi", "max_tokens": 2, "no_stop_trim": False, "return_hidden_states": False})
    assert r.status_code == 200, r.text


def test_input_token_logprobs_from_logprob_start_len(rollout, reference):
    """SGLang's prompt logprobs (what its frontend's ``select`` scores choices by): position 0 has none, each other
    token its logprob under the served weights given the tokens before it; ``logprob_start_len`` cuts the list."""
    model, _ = reference
    ids = [72, 101, 108, 108, 111, 32, 119]
    r = post(rollout, {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
                       "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 0}})
    assert r.status_code == 200, r.text
    got = r.json()["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in got] == ids and got[0][0] is None and all(isinstance(t[2], str) for t in got)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1).tolist()
    assert [t[0] for t in got[1:]] == pytest.approx(ref, abs=1e-4)
    # a later start, while the request also generates (batch of two prompts, n = 2: each answer carries its prompt's)
    r = post(rollout, {"input_ids": [ids, ids[:4]], "return_logprob": True, "logprob_start_len": 3,
                       "sampling_params": {"max_new_tokens": 2, "n": 2, "temperature": 0}})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert len(outs) == 4
    for out in outs[:2]:
        assert [t[1] for t in out["meta_info"]["input_token_logprobs"]] == ids[3:]
        assert [t[0] for t in out["meta_info"]["input_token_logprobs"]] == pytest.approx(ref[2:], abs=1e-4)
        assert len(out["meta_info"]["output_token_logprobs"]) == 2
    assert [t[1] for t in outs[2]["meta_info"]["input_token_logprobs"]] == ids[3:4]
    # -1 (the default) gives none; a start past the prompt is a 400 naming the field
    r = post(rollout, {"input_ids": ids, "return_logprob": True, "sampling_params": {"max_new_tokens": 1}})
    assert "input_token_logprobs" not in r.json()["meta_info"]
    r = post(rollout, {"input_ids": ids, "return_logprob": True, "logprob_start_len": 8,
                       "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and "logprob_start_len=8: more than the 7 tokens" in r.text, r.text


def test_the_default_max_new_tokens_is_cut_to_the_context_as_sglang_cuts_it(rollout):
    """No max_new_tokens sent: SGLang's default 128 was refused with a 400 ("prompt (450 tokens) + max_new_tokens
    (128) exceeds the context length 512") for a number the client never sent; SGLang cuts its default to the
    room left. A max_new_tokens the client sends past the context is still a 400."""
    r = post(rollout, {"text": "x" * 450, "sampling_params": {"temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 62}
    short = post(rollout, {"text": "x" * 10, "sampling_params": {"temperature": 0, "ignore_eos": True}})
    assert short.json()["meta_info"]["completion_tokens"] == 128  # the default where it fits
    sent = post(rollout, {"text": "x" * 450, "sampling_params": {"max_new_tokens": 128}})
    assert sent.status_code == 400 and "ask for at most 62 new tokens" in sent.json()["error"]["message"]
