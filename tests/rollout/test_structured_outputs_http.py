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


# ---- tool calls forced by tool_choice ---------------------------------------------------------------------
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "days", "unit"], "additionalProperties": False}
# bounded, so that no sampled call can outrun max_tokens (an unbounded integer of the random model can)
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999},
                                        "b": {"type": "integer", "minimum": -999, "maximum": 999}},
       "required": ["a", "b"], "additionalProperties": False}
FORCE_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
               {"type": "function", "function": {"name": "add", "parameters": ADD}}]


def _chat_tools(choice, n: int, **extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "weather in Paris?"}], "max_tokens": 120,
            "n": n, "seed": 7, "tools": FORCE_TOOLS, "tool_choice": choice, **extra}


def test_a_named_tool_choice_makes_every_sampled_call_parse_under_its_schema(rollout):
    import jsonschema

    choice = {"type": "function", "function": {"name": "weather"}}
    choices = _post(rollout.url, "/v1/chat/completions", _chat_tools(choice, 100))["choices"]
    assert len(choices) == 100
    for c in choices:
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]
        assert call["function"]["name"] == "weather" and not c["message"].get("content")
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def test_tool_choice_required_calls_one_of_the_tools_each_time(rollout):
    import jsonschema

    out = _post(rollout.url, "/v1/chat/completions", _chat_tools("required", 20, parallel_tool_calls=False))
    for c in out["choices"]:
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]  # parallel_tool_calls false: exactly one
        name = call["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), {"weather": WEATHER, "add": ADD}[name])


@pytest.mark.parametrize("tools, choice, says", [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}],
     {"type": "function", "function": {"name": "f"}}, "tools[0].function.parameters"),
    ([FORCE_TOOLS[1], {"type": "function", "function": {"name": "g", "parameters": {"type": "bogus"}}}],
     "required", "tools[1].function.parameters"),
    ([FORCE_TOOLS[1], {"type": "function", "function": {"name": "g", "parameters": ["not", "a", "schema"]}}],
     {"type": "function", "function": {"name": "add"}}, "tools[1].function.parameters"),
    (FORCE_TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
    (None, "required", "tool_choice"),
])
def test_a_bad_forced_tool_is_a_400_naming_the_field(rollout, tools, choice, says):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "tool_choice": choice,
            **({"tools": tools} if tools is not None else {})}
    r = httpx.post(f"{rollout.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and says in r.text, r.text
