"""Structured outputs on every generation route of a rollout service (hf engine, tiny model): SGLang's `regex` /
`json_schema` / `ebnf` on /generate, OpenAI's `response_format` on /v1/chat/completions, vLLM's
`structured_outputs` on /inference/v1/generate; a bad grammar is a 400 naming it."""

from __future__ import annotations

import json

import httpx
import pytest
import regex

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["city", "n"], "additionalProperties": False}


def _post(url: str, route: str, body: dict) -> dict:
    r = httpx.post(f"{url}{route}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _fits(text: str) -> bool:
    obj = json.loads(text)
    return set(obj) == {"city", "n"} and len(obj["city"]) <= 6 and type(obj["n"]) is int and 0 <= obj["n"] <= 99


def test_generate_json_schema_regex_and_ebnf(rollout):
    sp = {"max_new_tokens": 120, "n": 4, "json_schema": json.dumps(SCHEMA)}
    outs = _post(rollout.url, "/generate", {"text": "weather:", "sampling_params": sp})
    assert all(_fits(o["text"]) for o in outs), [o["text"] for o in outs]
    outs = _post(rollout.url, "/generate", {"text": "n:", "sampling_params": {"max_new_tokens": 10, "n": 4,
                                                                              "regex": "[1-9][0-9]?"}})
    assert all(regex.fullmatch("[1-9][0-9]?", o["text"]) for o in outs), [o["text"] for o in outs]
    outs = _post(rollout.url, "/generate", {"text": "pick:", "sampling_params": {
        "max_new_tokens": 10, "n": 4, "ebnf": 'root ::= "cat" | "dog"'}})
    assert {o["text"] for o in outs} <= {"cat", "dog"}


def test_chat_response_format_json_schema(rollout):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "weather?"}], "max_tokens": 120, "n": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}}
    choices = _post(rollout.url, "/v1/chat/completions", body)["choices"]
    assert all(_fits(c["message"]["content"]) for c in choices), [c["message"]["content"] for c in choices]


def test_inference_generate_structured_outputs(rollout):
    body = {"model": "tiny", "token_ids": [5, 6, 7], "sampling_params": {
        "max_tokens": 10, "n": 3, "structured_outputs": {"regex": "[a-d]{1,8}"}, "detokenize": True}}
    out = _post(rollout.url, "/inference/v1/generate", body)
    tok = __import__("deploy.local.tiny_model", fromlist=["build_tokenizer"]).build_tokenizer()
    texts = [tok.decode(c["token_ids"], skip_special_tokens=True) for c in out["choices"]]
    assert all(regex.fullmatch("[a-d]{1,8}", t) for t in texts), texts


@pytest.mark.parametrize("sp, says", [
    ({"regex": "(open"}, "regex"),
    ({"json_schema": "{oops"}, "json_schema"),
])
def test_a_bad_grammar_is_a_400_naming_it(rollout, sp, says):
    r = httpx.post(f"{rollout.url}/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 4, **sp}},
                   timeout=60)
    assert r.status_code == 400 and says in r.json()["detail"], r.text
