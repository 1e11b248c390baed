"""The `openai` client against /v1/completions, /v1/chat/completions and /v1/models."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from transformers import AutoTokenizer


@pytest.fixture(scope="module")
def client(rollout):
    return openai.OpenAI(base_url=f"{rollout.url}/v1", api_key="unused", timeout=60, max_retries=0)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_one_model_is_retrieved_by_name_and_another_name_is_a_404_saying_what_is_served(client):
    """`client.models.retrieve("tiny")` met a bare 404 "Not Found": the route did not exist."""
    card = client.models.retrieve("tiny")
    assert (card.id, card.object, card.owned_by) == ("tiny", "model", "fleetrl")
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4")
    assert err.value.body["message"] == "model 'gpt-4' is not served here; this server serves 'tiny'"


def test_completion_with_logprobs_n_and_token_ids(client, rollout):
    r = client.completions.create(model="tiny", prompt="2+2=", max_tokens=5, n=2, logprobs=2, temperature=0.8,
                                  seed=1, extra_body={"return_token_ids": True, "ignore_eos": True,
                                                                  "return_tokens_as_token_ids": True})
    assert len(r.choices) == 2 and [c.index for c in r.choices] == [0, 1]
    tok = AutoTokenizer.from_pretrained(rollout.model_dir)
    for c in r.choices:
        extra = c.model_extra
        assert extra["prompt_token_ids"] == tok.encode("2+2=")
        assert len(extra["token_ids"]) == 5 and c.finish_reason == "length"
        assert len(c.logprobs.token_logprobs) == 5 and all(lp <= 0 for lp in c.logprobs.token_logprobs)
        # byte tokens can decode to the same text; as "token_id:<id>" strings the alternatives stay distinct
        assert all(len(alts) == 2 for alts in c.logprobs.top_logprobs)
        assert c.logprobs.tokens == [f"token_id:{t}" for t in extra["token_ids"]]
    assert r.usage.completion_tokens == 10 and r.usage.prompt_tokens == 8


def test_completion_token_prompt_and_stop(client):
    free = client.completions.create(model="tiny", prompt=[72, 105], max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True, "return_token_ids": True})
    ids = free.choices[0].model_extra["token_ids"]
    r = client.completions.create(model="tiny", prompt=[72, 105], max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True, "stop_token_ids": [ids[3]]})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["token_ids"] == ids[: ids.index(ids[3]) + 1]


def test_chat_completion_uses_template_and_returns_token_ids(client, rollout):
    tok = AutoTokenizer.from_pretrained(rollout.model_dir)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, logprobs=True, top_logprobs=3,
                                       temperature=0, extra_body={"return_token_ids": True})
    expected_prompt = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                                 add_special_tokens=False)
    assert r.model_extra["prompt_token_ids"] == expected_prompt
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    ids = choice.model_extra["token_ids"]
    assert 1 <= len(ids) <= 6
    assert len(choice.logprobs.content) == len(ids)
    assert all(len(c.top_logprobs) == 3 for c in choice.logprobs.content)
    # greedy: the sampled token is the top alternative
    assert all(abs(c.logprob - c.top_logprobs[0].logprob) < 1e-5 for c in choice.logprobs.content)


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "count"}],
                                            max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True, "ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    token_ids = [t for c in chunks for ch in c.choices for t in (ch.model_extra.get("token_ids") or [])]
    assert len(token_ids) == 5
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 5
    full = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "count"}],
                                          max_tokens=5, temperature=0, extra_body={"return_token_ids": True, "ignore_eos": True})
    assert full.choices[0].model_extra["token_ids"] == token_ids
    assert "".join(ch.delta.content or "" for c in chunks for ch in c.choices) == full.choices[0].message.content


def test_completion_streaming(client):
    stream = client.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert sum(1 for c in chunks for ch in c.choices if ch.finish_reason == "length") == 1


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-nope", prompt="x", max_tokens=2)
    assert "tiny" in str(err.value)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_zero_gives_the_sampled_token_only(rollout, stream):
    """logprobs: 0 (vLLM: no alternatives, the sampled token's logprob): top_logprobs holds one entry per token,
    the sampled one (before, the field was left out, which the response schema requires)."""
    body = {"model": "tiny", "prompt": "2+2=", "max_tokens": 4, "logprobs": 0, "ignore_eos": True, "stream": stream}
    r = httpx.post(f"{rollout.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0].get("logprobs")]
        tokens = [t for lp in lps for t in lp["tokens"]]
        tops = [t for lp in lps for t in lp["top_logprobs"]]
        token_lps = [x for lp in lps for x in lp["token_logprobs"]]
    else:
        lp = r.json()["choices"][0]["logprobs"]
        tokens, tops, token_lps = lp["tokens"], lp["top_logprobs"], lp["token_logprobs"]
    assert len(tokens) == len(tops) == len(token_lps) == 4
    assert tops == [{t: v} for t, v in zip(tokens, token_lps)]


def test_an_image_part_is_refused_naming_the_part(client):
    """A chat message with an image_url part got a 400 listing pydantic's union alternatives (str, list of text
    parts) for every part; it names the part and what is served now."""
    parts = [{"type": "text", "text": "what is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=2)
    message = err.value.body["message"]
    assert "content[1] is a part of type 'image_url': only text parts" in message and "messages" in message, message
    assert "str" not in message.split("content[1]")[0][-40:] and message.count("image_url") == 1, message
