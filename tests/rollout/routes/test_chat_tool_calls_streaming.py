"""Streamed ``tool_calls`` in ``/v1/chat/completions`` (vLLM's shape): content streams until the model starts a
call, the call's marker text never shows as content, each readable call is a ``delta.tool_calls`` entry and the
choice ends with ``tool_calls``; the `openai` client assembles the same message as the unstreamed reply. An
agent that streams runs the tool loop through a session and trains on exactly what an unstreamed one does.

The model is a script (see test_chat_tool_calls.py) that streams its reply one token per delta, so the marker
arrives split across deltas. The app is the real one, served over ASGI in-process, with the real session
manager on the tests' Redis.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from services.rollout.app import create_app
from services.rollout.engines.types import SequenceDelta, SequenceRequest
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from tests.rollout.agents.scripted_engine import IM_END, ScriptedEngine
from tests.rollout.conftest import CONTROL_TOKEN
from tests.rollout.routes.conftest import AUTH, RUN
from tests.rollout.routes.test_chat_tool_calls import CALL, TOOLS, oai
from tests.rollout.routes.test_sessions_openai import pushed

BROKEN = '<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>'
SCRIPTS = {
    "call": CALL,
    "talk-then-call": "Let me add them.\n" + CALL,
    "two-calls": CALL + "\n" + CALL.replace('"b": 3', '"b": 4'),
    "broken": "Trying: " + BROKEN,
    "almost-a-marker": "a <tool but no call",
}


def script(prompt: str) -> str:
    if "<|im_start|>tool" in prompt:
        return "The answer is 5."
    return next((v for k, v in SCRIPTS.items() if f"[{k}]" in prompt), CALL)


class TokenByToken(ScriptedEngine):
    """The scripted reply, one token per delta (text decoded incrementally)."""

    async def _stream(self, request: SequenceRequest) -> AsyncIterator[SequenceDelta]:
        async for whole in super()._stream(request):
            ids = whole.token_ids
            for i, t in enumerate(ids):
                last = i == len(ids) - 1
                text = (self.tokenizer.decode(ids[:i + 1], skip_special_tokens=True)
                        [len(self.tokenizer.decode(ids[:i], skip_special_tokens=True)):])
                yield SequenceDelta(token_ids=[t], logprobs=[-0.25], text=text, finish=whole.finish if last else None)


@pytest.fixture()
async def client(tiny_model_dir, redis_server):
    settings = RolloutSettings(model=str(tiny_model_dir), served_model_name="tiny", control_token=CONTROL_TOKEN,
                               redis_url=redis_server.url, run_name=RUN, sessions={"enabled": True})
    app = create_app(settings, service=RolloutService(settings, engine=TokenByToken(str(tiny_model_dir), script, context_length=4096)))
    async with (app.router.lifespan_context(app),
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollout", headers=AUTH) as http):
        yield http


def ask(case: str) -> list[dict]:
    return [{"role": "user", "content": f"2+3? [{case}]"}]


async def assembled(agent, **kw):
    """``stream=True``, the chunks accumulated by the `openai` library's own stream state (what its
    ``.stream()`` helper uses; the helper itself insists on strict tools)."""
    state = ChatCompletionStreamState()
    async for chunk in await agent.chat.completions.create(stream=True, **kw):
        state.handle_chunk(chunk)
    return state.get_final_completion()


async def chunks(http: httpx.AsyncClient, case: str, **extra) -> list[dict]:
    body = {"model": "tiny", "messages": ask(case), "max_tokens": 400, "stream": True, **extra}
    r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("case", list(SCRIPTS))
async def test_streamed_message_is_the_unstreamed_one(client, case):
    agent = oai(client)
    plain = (await agent.chat.completions.create(model="tiny", messages=ask(case), tools=TOOLS, max_tokens=400))
    streamed = await assembled(agent, model="tiny", messages=ask(case), tools=TOOLS, max_tokens=400)
    want, got = plain.choices[0], streamed.choices[0]
    assert got.finish_reason == want.finish_reason
    assert (got.message.content or None) == want.message.content  # the first chunk's "" starts the content
    calls = [(c.type, c.function.name, json.loads(c.function.arguments)) for c in got.message.tool_calls or []]
    assert calls == [(c.type, c.function.name, json.loads(c.function.arguments)) for c in want.message.tool_calls or []]
    assert all(c.id.startswith("call_") for c in got.message.tool_calls or [])


async def test_content_streams_then_calls_with_no_marker_text(client):
    got = await chunks(client, "talk-then-call", tools=TOOLS)
    deltas = [ch["delta"] for c in got for ch in c["choices"]]
    content = [d["content"] for d in deltas if d.get("content")]
    assert "".join(content) == "Let me add them."
    assert len(content) > 3  # it streamed, token by token
    assert not any("<" in (d.get("content") or "") for d in deltas)
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    (call,) = calls
    assert call[0]["index"] == 0 and call[0]["type"] == "function" and call[0]["id"].startswith("call_")
    assert call[0]["function"]["name"] == "add" and json.loads(call[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    finishes = [ch.get("finish_reason") for c in got for ch in c["choices"] if ch.get("finish_reason")]
    assert finishes == ["tool_calls"] and got[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_two_calls_get_indexes_and_token_ids_still_cover_every_token(client):
    got = await chunks(client, "two-calls", tools=TOOLS, return_token_ids=True, logprobs=True)
    calls = [tc for c in got for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
    assert [(tc["index"], json.loads(tc["function"]["arguments"])["b"]) for tc in calls] == [(0, 3), (1, 4)]
    assert calls[0]["id"] != calls[1]["id"]
    ids = [t for c in got for ch in c["choices"] for t in ch.get("token_ids", [])]
    lps = [e["logprob"] for c in got for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content", [])]
    plain = (await client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": ask("two-calls"), "tools": TOOLS, "max_tokens": 400,
        "return_token_ids": True})).json()
    assert ids == plain["choices"][0]["token_ids"] and ids[-1] == IM_END and len(lps) == len(ids)


@pytest.mark.parametrize("extra", [{}, {"tool_choice": "none"}])
async def test_without_tools_the_call_streams_as_content(client, extra):
    got = await chunks(client, "call", **({"tools": TOOLS, **extra} if extra else {}))
    deltas = [ch["delta"] for c in got for ch in c["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == CALL
    assert not any("tool_calls" in d for d in deltas)
    assert got[-1]["choices"][0]["finish_reason"] == "stop"


async def test_max_tokens_inside_a_call_leaves_length(client):
    """Cut inside the call: the unterminated call is read at the end, as the unstreamed parser reads it; the
    finish reason stays ``length``."""
    got = await chunks(client, "call", tools=TOOLS, max_tokens=30)
    deltas = [ch["delta"] for c in got for ch in c["choices"]]
    assert not any("tool_calls" in d for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas).startswith("<tool_call>")
    assert got[-1]["choices"][0]["finish_reason"] == "length"


async def tool_loop(client: httpx.AsyncClient, pid: str, stream: bool) -> list:
    sid = (await client.post("/sessions", json={"prompt_id": pid}, headers=AUTH)).json()["session_id"]
    agent = oai(client, f"/sessions/{sid}/v1")
    messages = [{"role": "user", "content": "2+3?"}]
    replies = []
    for _ in range(2):
        if stream:
            r = await assembled(agent, model="tiny", messages=messages, tools=TOOLS, max_tokens=400)
        else:
            r = await agent.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=400)
        message = r.choices[0].message
        replies.append(r.choices[0])
        if message.tool_calls:  # the agent echoes the message it assembled, then the tool's result
            echoed = {"role": "assistant", "content": message.content,
                      "tool_calls": [c.model_dump(exclude_none=True) for c in message.tool_calls]}
            messages += [echoed, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "5"}]
    state = (await client.get(f"/sessions/{sid}", headers=AUTH)).json()
    assert state["calls"] == 2 and state["trajectories"] == 1  # the second call continued the first's ids
    await client.post(f"/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH)
    return replies


async def test_streaming_agent_tool_loop_trains_on_what_an_unstreamed_one_does(client, redis_server):
    """The streamed message the agent echoes back (assembled from the chunks) continues the session's ids, so
    both turns are one trajectory, the same as the unstreamed agent's (test_chat_tool_calls.py)."""
    await tool_loop(client, "tool-loop-plain", stream=False)
    replies = await tool_loop(client, "tool-loop-streamed", stream=True)
    assert replies[0].finish_reason == "tool_calls" and replies[0].message.tool_calls[0].function.name == "add"
    assert replies[1].message.content == "The answer is 5." and replies[1].finish_reason == "stop"
    got = pushed(redis_server.url)
    s, p = got["tool-loop-streamed#0"], got["tool-loop-plain#0"]
    assert "<tool_call>" in s.response_text and "<|im_start|>tool\n5<|im_end|>" in s.response_text
    assert list(s.prompt_token_ids) == list(p.prompt_token_ids)
    assert list(s.response_token_ids) == list(p.response_token_ids)
    assert list(s.action_mask) == list(p.action_mask)
    assert list(s.response_logprobs) == list(p.response_logprobs)
