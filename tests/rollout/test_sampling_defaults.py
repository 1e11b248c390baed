"""Clients that send every sampling default (sglang-router, SGLang's frontend, SDK wrappers) are served on every
route; a penalty the hf engine applies; a field the engine cannot honour is a 400 naming it and the engine. The weight
version is one type, a decimal string, on every rollout route."""

from __future__ import annotations

import httpx
import pytest
import regex

NEUTRAL = {"repetition_penalty": 1.0, "frequency_penalty": 0, "presence_penalty": 0.0}
SGLANG = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}
CMPL = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0.0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0.0}
TOKENS = {"model": "tiny", "token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 2, "temperature": 0.0}}


def _with(route: str, fields: dict) -> dict:
    """The route's request with ``fields`` where that route takes sampling fields."""
    if route == "/generate":
        return {**SGLANG, "sampling_params": {**SGLANG["sampling_params"], **fields}}
    if route == "/inference/v1/generate":
        return {**TOKENS, "sampling_params": {**TOKENS["sampling_params"], **fields}}
    return {**(CMPL if route == "/v1/completions" else CHAT), **fields}


ROUTES = ["/generate", "/v1/completions", "/v1/chat/completions", "/inference/v1/generate"]


@pytest.mark.parametrize("route", ROUTES)
def test_neutral_penalties_are_accepted_everywhere(rollout, route):
    r = httpx.post(f"{rollout.url}{route}", json=_with(route, NEUTRAL), timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("field,value", [("repetition_penalty", 1.1), ("frequency_penalty", 0.5),
                                         ("presence_penalty", -0.2)])
def test_a_real_penalty_is_applied(rollout, route, field, value):
    r = httpx.post(f"{rollout.url}{route}", json=_with(route, {field: value}), timeout=60)
    assert r.status_code == 200, r.text


UNHONOURED = {"/generate": ("lora_path", "adapter-1"), "/v1/completions": ("use_beam_search", True),
              "/v1/chat/completions": ("logit_bias", {"5": 1.0}),
              "/inference/v1/generate": ("logit_bias", {"5": 1.0})}


@pytest.mark.parametrize("route", ROUTES)
def test_a_field_the_engine_cannot_honour_is_refused_naming_it_and_the_engine(rollout, route):
    field, value = UNHONOURED[route]
    body = _with(route, {field: value}) if route == "/inference/v1/generate" else {
        **_with(route, {}), field: value}
    r = httpx.post(f"{rollout.url}{route}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert field in detail and ("`hf` engine" in detail or "not supported" in detail), detail


def test_sglang_frontend_body_is_served(rollout):
    """Issue 37: main answered 400 `sampling_params.spaces_between_special_tokens: unknown field ...`."""
    from tests.shared.test_upstream_fields import SGLANG_FRONTEND_BODY

    r = httpx.post(f"{rollout.url}/generate", json=SGLANG_FRONTEND_BODY, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] >= 1


def test_max_new_tokens_zero_answers_for_the_prompt_alone(rollout):
    """SGLang's frontend caches a batch's shared prefix with max_new_tokens=0."""
    r = httpx.post(f"{rollout.url}/generate", json={"text": ["hello there", "hi"], "sampling_params":
                                                      {"max_new_tokens": 0}}, timeout=60)
    assert r.status_code == 200, r.text
    outs = r.json()
    assert [o["text"] for o in outs] == ["", ""] and [o["output_ids"] for o in outs] == [[], []]
    assert all(o["meta_info"]["prompt_tokens"] >= 1 and o["meta_info"]["completion_tokens"] == 0 for o in outs)
    assert outs[0]["meta_info"]["finish_reason"] == {"type": "length", "length": 0}


def test_stop_regex_ends_the_text_and_names_the_pattern(rollout):
    base = {"text": "hello", "sampling_params": {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}}
    free = httpx.post(f"{rollout.url}/generate", json=base, timeout=60).json()
    text = free["text"]
    assert len(text) >= 3, text
    pattern = regex.escape(text[1:3])
    r = httpx.post(f"{rollout.url}/generate", json={**base, "sampling_params": {**base["sampling_params"],
                                                                                "stop_regex": [pattern]}}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    at = regex.search(pattern, text).start()
    assert out["text"] == text[:at]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}


def test_weight_version_is_a_decimal_string_on_every_route(rollout):
    def version_of(route: str, body: dict) -> object:
        r = httpx.post(f"{rollout.url}{route}", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    served = httpx.get(f"{rollout.url}/model_info", timeout=10).json()["weight_version"]
    assert isinstance(served, str) and served.isdigit()
    seen = {
        "/generate meta_info": version_of("/generate", SGLANG)["meta_info"]["weight_version"],
        "/health": httpx.get(f"{rollout.url}/health", timeout=10).json()["weight_version"],
        "/inference/v1/generate": version_of("/inference/v1/generate", TOKENS)["weight_version"],
    }
    for route, body in (("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)):
        reply = version_of(route, body)
        seen[route] = reply["weight_version"]
        seen[f"{route} metadata (SGLang's place)"] = reply["metadata"]["weight_version"]
    assert seen == {k: served for k in seen}
