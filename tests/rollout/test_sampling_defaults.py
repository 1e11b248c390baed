"""Clients that send every sampling default (sglang-router, SDK wrappers) are served on every route; a penalty at
any other value is a 400 naming it. The weight version is one type, a decimal string, on every rollout route."""

from __future__ import annotations

import httpx
import pytest

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
def test_a_real_penalty_is_refused_naming_it(rollout, route, field, value):
    r = httpx.post(f"{rollout.url}{route}", json=_with(route, {field: value}), timeout=60)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert field in detail and "not supported" in detail, detail


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
