"""An agent on the plain `openai` client, pointed at a session, trains through it: the experiences in Redis hold
exactly the ids the engine produced, turn by turn, the template delta of each environment message between
them, the right mask, the engine's logprobs and the reward given."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
import redis
from transformers import AutoTokenizer

from services.rollout.chat_tokens import ChatTokens
from shared import keys
from shared.codec import decode
from shared.schemas import Experience
from tests.rollout.conftest import CONTROL_TOKEN
from tests.rollout.routes.conftest import AUTH, RUN


def pushed(redis_url: str) -> dict[str, Experience]:
    r = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        entries = r.xrange(keys.experiences_stream(RUN))
    finally:
        r.close()
    return {e.id: e for e in (decode(fields[b"p"], Experience) for _, fields in entries)}


def create(url: str, **body) -> str:
    r = httpx.post(f"{url}/sessions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def finish(url: str, sid: str, **body) -> dict:
    r = httpx.post(f"{url}/sessions/{sid}/finish", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def tok(session_rollout):
    return AutoTokenizer.from_pretrained(session_rollout.model_dir)


def test_openai_agent_three_turns_become_one_exact_trajectory(session_rollout, redis_server, tok):
    url = session_rollout.url
    sid = create(url, prompt_id="agent-task-1", group_size=2, index=1, label="42", metadata={"env": "chat"})
    client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 6*7?"}]
    env_replies = [[{"role": "user", "content": "are you sure?"}],
                   [{"role": "user", "content": "check with a tool"}, {"role": "user", "content": "then answer"}]]
    turns = []  # (prompt ids, output ids, logprobs) as the engine returned them
    for k in range(3):
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=1.0,
                                           logprobs=True, extra_body={"return_token_ids": True})
        choice = r.choices[0]
        turns.append((r.model_extra["prompt_token_ids"], choice.model_extra["token_ids"],
                      [c.logprob for c in choice.logprobs.content]))
        messages.append(choice.message.model_dump(exclude_none=True))
        if k < 2:
            messages += env_replies[k]
    done = finish(url, sid, reward=0.5, reward_components={"judge": 0.5})
    assert done["experience_ids"] == ["agent-task-1#1"] and done["stream"] == keys.experiences_stream(RUN)

    exp = pushed(redis_server.url)["agent-task-1#1"]
    ct = ChatTokens(tok)
    first = tok.encode(tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)
    assert list(exp.prompt_token_ids) == turns[0][0] == first
    expected, mask, lps = [], [], []
    for k, (prompt, out, lp) in enumerate(turns):
        if k:
            prev_prompt, prev_out, _ = turns[k - 1]
            # token-in / token-out: each prompt is the previous prompt + the model's own ids + the env delta
            env = prompt[len(prev_prompt) + len(prev_out):]
            assert prompt[: len(prev_prompt) + len(prev_out)] == prev_prompt + prev_out
            assert env == ct.close_turn(prev_out) + ct.delta(env_replies[k - 1])
            expected += env
            mask += [0] * len(env)
            lps += [0.0] * len(env)
        expected += out
        mask += [1] * len(out)
        lps += lp
    assert list(exp.response_token_ids) == expected
    assert list(exp.action_mask) == mask
    np.testing.assert_allclose(np.asarray(exp.response_logprobs), lps, rtol=0, atol=1e-5)
    assert exp.reward == 0.5 and exp.reward_components == {"judge": 0.5}
    assert (exp.group_id, exp.group_size, exp.index, exp.label) == ("agent-task-1", 2, 1, "42")
    assert exp.metadata["session_id"] == sid and exp.metadata["turns"] == 3 and exp.metadata["env"] == "chat"
    assert exp.weight_version == 0 and exp.version_spans is None
    assert exp.sampling.temperature == 1.0 and exp.sampling.max_tokens == 6


def test_header_session_on_plain_routes_stitches_completions(session_rollout, redis_server):
    """X-Session-ID on /v1/completions (token prompts): the second prompt extends the first by env tokens."""
    url = session_rollout.url
    sid = create(url, prompt_id="header-task")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0,
                           default_headers={"X-Session-ID": sid, **AUTH})
    prompt = [72, 105, 33]
    r1 = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, temperature=0.7,
                                   extra_body={"return_token_ids": True, "ignore_eos": True})
    out1 = r1.choices[0].model_extra["token_ids"]
    env = [40, 41, 42]
    r2 = client.completions.create(model="tiny", prompt=prompt + out1 + env, max_tokens=4, temperature=0.7,
                                   extra_body={"return_token_ids": True, "ignore_eos": True})
    out2 = r2.choices[0].model_extra["token_ids"]
    finish(url, sid, reward=-1.0)
    exp = pushed(redis_server.url)["header-task#0"]
    assert list(exp.prompt_token_ids) == prompt
    assert list(exp.response_token_ids) == out1 + env + out2
    assert list(exp.action_mask) == [1] * 5 + [0] * 3 + [1] * 4
    assert exp.finish_reason == "length" and exp.sampling.max_tokens == 5


def test_a_call_that_does_not_extend_starts_a_second_trajectory(session_rollout, redis_server):
    url = session_rollout.url
    sid = create(url, prompt_id="rewritten")
    base = f"{url}/sessions/{sid}/v1/completions"
    a = httpx.post(base, json={"prompt": [50, 51], "max_tokens": 3, "ignore_eos": True}, timeout=60, headers=AUTH)
    b = httpx.post(base, json={"prompt": [60, 61, 62], "max_tokens": 3, "ignore_eos": True}, timeout=60, headers=AUTH)
    assert a.status_code == b.status_code == 200
    state = httpx.get(f"{url}/sessions/{sid}", headers=AUTH, timeout=10).json()
    assert state["calls"] == 2 and state["trajectories"] == 2
    done = finish(url, sid, reward=1.0)
    assert done["experience_ids"] == ["rewritten#0", "rewritten#0~1"]
    got = pushed(redis_server.url)
    assert list(got["rewritten#0~1"].prompt_token_ids) == [60, 61, 62]
    assert got["rewritten#0~1"].metadata["trajectories"] == 2
