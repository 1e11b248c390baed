"""``tool_calls`` in ``/v1/chat/completions``: a request that declares tools gets the model's calls parsed (hermes
format) with finish_reason ``tool_calls``; an agent on the `openai` client runs the tool loop through a session and
the experience holds the model's ids and the tool message's template delta.

The model is a script here (the tiny random model never writes a tool call): an engine whose reply is chosen from
the prompt text, so the test can make the model call a tool and then answer. The app is the real one, served over
ASGI in-process, with the real session manager on the tests' Redis.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from services.rollout.app import create_app
from services.rollout.chat_tokens import ChatTokens
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from tests.rollout.agents.scripted_engine import ScriptedEngine
from tests.rollout.conftest import CONTROL_TOKEN
from tests.rollout.routes.conftest import AUTH, RUN
from tests.rollout.routes.test_sessions_openai import pushed

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]


def tool_script(prompt: str) -> str:
    """Calls ``add`` until a tool result is in the prompt, then answers."""
    return "The answer is 5." if "<|im_start|>tool" in prompt else CALL


@pytest.fixture()
async def client(tiny_model_dir, redis_server):
    settings = RolloutSettings(model=str(tiny_model_dir), served_model_name="tiny", control_token=CONTROL_TOKEN,
                               redis_url=redis_server.url, run_name=RUN, sessions={"enabled": True})
    app = create_app(settings, service=RolloutService(settings, engine=ScriptedEngine(str(tiny_model_dir), tool_script)))
    async with (app.router.lifespan_context(app),
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rollout", headers=AUTH) as http):
        yield http


def oai(http: httpx.AsyncClient, base: str = "/v1") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://rollout{base}", api_key=CONTROL_TOKEN, http_client=http, max_retries=0)


async def test_declared_tools_give_tool_calls(client):
    r = await oai(client).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2+3?"}],
                                                   tools=TOOLS, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}


@pytest.mark.parametrize("extra", [{}, {"tool_choice": "none"}])
async def test_without_tools_the_text_is_content(client, extra):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 100}
    if extra:
        body.update(tools=TOOLS, **extra)
    r = (await client.post("/v1/chat/completions", json=body)).json()
    assert r["choices"][0]["message"] == {"role": "assistant", "content": CALL}
    assert r["choices"][0]["finish_reason"] == "stop"


async def test_tool_loop_through_a_session(client, redis_server, tiny_model_dir):
    sid = (await client.post("/sessions", json={"prompt_id": "tool-task"}, headers=AUTH)).json()["session_id"]
    agent = oai(client, f"/sessions/{sid}/v1")
    messages = [{"role": "user", "content": "2+3?"}]
    first = await agent.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=100,
                                                extra_body={"return_token_ids": True})
    call = first.choices[0].message.tool_calls[0]
    tool_msg = {"role": "tool", "tool_call_id": call.id, "content": "5"}
    messages += [first.choices[0].message.model_dump(exclude_none=True), tool_msg]
    second = await agent.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=100,
                                                 extra_body={"return_token_ids": True})
    assert second.choices[0].message.content == "The answer is 5." and second.choices[0].finish_reason == "stop"
    done = (await client.post(f"/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH)).json()
    assert done["experience_ids"] == ["tool-task#0"]

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ct = ChatTokens(tok, tools=TOOLS)
    out1, out2 = first.choices[0].model_extra["token_ids"], second.choices[0].model_extra["token_ids"]
    env = ct.close_turn(out1) + ct.delta([tool_msg])
    assert second.model_extra["prompt_token_ids"] == first.model_extra["prompt_token_ids"] + out1 + env
    exp = pushed(redis_server.url)["tool-task#0"]
    assert list(exp.response_token_ids) == out1 + env + out2
    assert list(exp.action_mask) == [1] * len(out1) + [0] * len(env) + [1] * len(out2)
    assert "<tool_call>" in exp.response_text and "<|im_start|>tool\n5<|im_end|>" in exp.response_text
