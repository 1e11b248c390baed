"""``stream: true`` in a session, against a real rollout process (hf engine, tiny model): the agent gets the plain
SSE stream, and the call is recorded once its sequence ended exactly as the same call unstreamed is recorded;
a client that leaves mid-stream has its generation aborted and nothing recorded, and the session goes on."""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from tests.procs import starts_processes, stop
from tests.rollout.conftest import CONTROL_TOKEN, Server, start_rollout
from tests.rollout.routes.conftest import AUTH, session_config
from tests.rollout.routes.test_sessions_openai import create, finish, pushed
from tests.rollout.test_load_and_pause import metric, wait_inflight_zero

TURN_2 = [{"role": "user", "content": "and then?"}]


@pytest.fixture(scope="module")
def tok(session_rollout):
    return AutoTokenizer.from_pretrained(session_rollout.model_dir)


@pytest.fixture(scope="module")
@starts_processes
def slow_rollout(redis_server, tmp_path_factory):
    """Session mode on a model slow enough (wider, deeper, long context) that a 6,000-token stream is still
    running seconds later, whatever the machine: the tiny model's 400 tokens could end before the client left."""
    from deploy.local.tiny_model import build_tiny_causal_lm

    tmp = tmp_path_factory.mktemp("slow-session-rollout")
    model = build_tiny_causal_lm(tmp / "model", hidden_size=256, layers=4, max_positions=8192)
    proc, url, log = start_rollout(tmp, "rollout", session_config(model, redis_server.url))
    yield Server(url=url, log=log, model_dir=model)
    stop(proc)


def model_turns(exp) -> list[list[int]]:
    """The model's ids of each turn of an experience (the runs of mask 1)."""
    turns, prev = [], 0
    for t, m in zip(exp.response_token_ids, exp.action_mask):
        if m and not prev:
            turns.append([])
        if m:
            turns[-1].append(int(t))
        prev = m
    return turns


def chat_session(url: str, sid: str, stream: bool) -> list[dict]:
    """Two greedy chat turns of an `openai` agent in session ``sid``; each turn's message as the agent has it."""
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0)
    messages = [{"role": "user", "content": "count with me"}]
    got = []
    for k in range(2):
        kw = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0.0, "logprobs": True}
        if stream:
            text, finish_reason = "", None
            for chunk in client.chat.completions.create(stream=True, **kw):
                for c in chunk.choices:
                    text += c.delta.content or ""
                    finish_reason = c.finish_reason or finish_reason
            message = {"role": "assistant", "content": text}
        else:
            r = client.chat.completions.create(**kw)
            message, finish_reason = r.choices[0].message.model_dump(exclude_none=True), r.choices[0].finish_reason
        got.append({**message, "finish_reason": finish_reason})
        messages += [message, *(TURN_2 if k == 0 else [])]
    return got


def test_streamed_chat_session_records_what_the_unstreamed_one_does(session_rollout, redis_server, tok):
    url = session_rollout.url
    streamed, plain = create(url, prompt_id="stream-chat"), create(url, prompt_id="plain-chat")
    s_turns = chat_session(url, streamed, stream=True)
    p_turns = chat_session(url, plain, stream=False)
    for sid in (streamed, plain):
        state = httpx.get(f"{url}/sessions/{sid}", headers=AUTH, timeout=10).json()
        assert state["calls"] == 2 and state["trajectories"] == 1  # the second turn continued the first's ids
        finish(url, sid, reward=1.0)
    got = pushed(redis_server.url)
    s, p = got["stream-chat#0"], got["plain-chat#0"]
    ids = model_turns(s)
    assert len(ids) == 2
    for k in range(2):  # what streamed is the recorded model tokens, decoded
        assert s_turns[k]["content"] == tok.decode(ids[k], skip_special_tokens=True)
        assert s_turns[k]["finish_reason"] == p_turns[k]["finish_reason"]
    assert [t["content"] for t in s_turns] == [t["content"] for t in p_turns]
    assert list(s.prompt_token_ids) == list(p.prompt_token_ids)
    assert list(s.response_token_ids) == list(p.response_token_ids)
    assert list(s.action_mask) == list(p.action_mask)
    np.testing.assert_allclose(np.asarray(s.response_logprobs), np.asarray(p.response_logprobs), rtol=0, atol=1e-5)
    assert (s.finish_reason, s.weight_version, s.version_spans) == (p.finish_reason, p.weight_version, None)
    assert s.metadata["turns"] == p.metadata["turns"] == 2


def sse(r: httpx.Response) -> list[dict]:
    events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_streamed_completion_and_token_calls_are_recorded(session_rollout, redis_server):
    """X-Session-ID on /v1/completions, then the session's token-in route, both streamed: one trajectory of
    exactly the ids and logprobs the chunks carried."""
    url = session_rollout.url
    sid = create(url, prompt_id="stream-tokens")
    prompt = [72, 105, 33]
    with httpx.stream("POST", f"{url}/v1/completions", headers={"X-Session-ID": sid, **AUTH}, timeout=60, json={
            "model": "tiny", "prompt": prompt, "max_tokens": 5, "stream": True, "logprobs": 0,
            "return_token_ids": True, "ignore_eos": True}) as r:
        assert r.status_code == 200
        first = sse(r)
    out1 = [t for c in first for ch in c["choices"] for t in ch["token_ids"]]
    lp1 = [x for c in first for ch in c["choices"] for x in ch["logprobs"]["token_logprobs"]]
    assert len(out1) == 5 and first[-1]["choices"][0]["finish_reason"] == "length"
    env = [40, 41]
    with httpx.stream("POST", f"{url}/sessions/{sid}/inference/v1/generate", timeout=60, headers=AUTH, json={
            "token_ids": prompt + out1 + env, "stream": True,
            "sampling_params": {"max_tokens": 3, "logprobs": 0, "ignore_eos": True}}) as r:
        assert r.status_code == 200
        second = sse(r)
    out2 = [t for c in second for ch in c["choices"] for t in ch["token_ids"]]
    lp2 = [e["logprob"] for c in second for ch in c["choices"] for e in (ch["logprobs"] or {}).get("content", [])]
    finish(url, sid, reward=0.5)
    exp = pushed(redis_server.url)["stream-tokens#0"]
    assert list(exp.prompt_token_ids) == prompt
    assert list(exp.response_token_ids) == out1 + env + out2
    assert list(exp.action_mask) == [1] * 5 + [0] * 2 + [1] * 3
    assert list(exp.response_logprobs) == pytest.approx(lp1 + [0.0, 0.0] + lp2, abs=1e-5)
    assert exp.metadata["turns"] == 2


async def test_client_leaving_mid_stream_aborts_and_records_nothing(slow_rollout, redis_server):
    url = slow_rollout.url
    sid = create(url, prompt_id="left-mid-stream")
    base = f"/sessions/{sid}/v1/chat/completions"
    long = {"model": "tiny", "messages": [{"role": "user", "content": "talk"}], "max_tokens": 6000,
            "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=AUTH) as c:
        aborted = metric((await c.get("/metrics")).text, 'fleetrl_rollout_sequences_total{finish="abort"}')
        async with c.stream("POST", base, json=long) as r:
            assert r.status_code == 200
            # read three events and keep the iterator: breaking out of ``async for`` finalizes the generator,
            # which closes the response, i.e. the client would have left already
            lines, seen = r.aiter_lines(), 0
            while seen < 3:
                seen += (await anext(lines)).startswith("data:")
            # the session is held while its call streams: one conversation, one call at a time
            busy = await c.post(base, json={**long, "max_tokens": 2})
            assert busy.status_code == 409 and "in flight" in busy.json()["detail"]
        # left: the generation is aborted and its slot freed, nothing is recorded
        await wait_inflight_zero(c)
        after = metric((await c.get("/metrics")).text, 'fleetrl_rollout_sequences_total{finish="abort"}')
        assert after >= aborted + 1
        for _ in range(50):  # the server notices the disconnect asynchronously
            state = (await c.get(f"/sessions/{sid}", headers=AUTH)).json()
            if state["calls"] == 0 and state["trajectories"] == 0:
                break
            await asyncio.sleep(0.1)
        assert state["calls"] == 0 and state["trajectories"] == 0 and state["state"] == "open"
        # the session goes on: the next (streamed) call is recorded, and it alone is trained on
        short = {"model": "tiny", "messages": [{"role": "user", "content": "again"}], "max_tokens": 4,
                 "ignore_eos": True, "stream": True, "return_token_ids": True}
        async with c.stream("POST", base, json=short) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) async for line in r.aiter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
    prompt = events[0]["prompt_token_ids"]
    out = [t for e in events for ch in e["choices"] for t in ch.get("token_ids", [])]
    assert len(out) == 4
    done = finish(url, sid, reward=1.0)
    assert done["experience_ids"] == ["left-mid-stream#0"]
    exp = pushed(redis_server.url)["left-mid-stream#0"]
    assert list(exp.prompt_token_ids) == prompt and list(exp.response_token_ids) == out
    assert exp.metadata["turns"] == 1
