"""Trust-boundary probes against real rollout service processes (issue 26): what a request or a prompt task can
make the service compute or run is refused with a 4xx, quickly, and ``/health`` keeps answering meanwhile.

Two processes, started side by side once for the module: ``guarded`` (the defaults: a request cannot supply a
chat template; session mode with ``unknown_header_id: open``; a multi_turn worker) and ``trusting``
(``trust_request_chat_template``, so a request's template is rendered, bounded in time, off the event loop).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from shared import keys
from shared.experience_queue import StreamQueue
from shared.schemas import PromptTask
from tests.procs import stop
from tests.rollout.conftest import start_rollouts

pytestmark = pytest.mark.process  # starts service processes (tests/procs.py)

TOKEN = "probe-control-token"
RUN = "probes"
PROBE_S = 10.0  # every probe is answered within this
HEALTH_S = 2.0  # /health answers within this, attack or not
NESTED_LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}x"
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def servers(tiny_model_dir, redis_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probes")
    base = {"model": str(tiny_model_dir), "served_model_name": "tiny", "control_token": TOKEN,
            "engine": {"kind": "hf", "device": "cpu", "max_wait_ms": 2, "torch_threads": 1}}
    guarded = {**base, "redis_url": redis_server.url, "run_name": RUN, "weight_sidecar": False,
               "sessions": {"enabled": True, "unknown_header_id": "open"},
               "worker": {"enabled": True, "reward_url": "http://127.0.0.1:9", "poll_interval_s": 0.1,
                          "prompts_max_deliveries": 1, "rollout_function": "multi_turn",
                          "sampling": {"max_new_tokens": 4}, "agent": {"environment": "echo"}},
               "run": {"prompt_claim_idle_ms": 100}}
    trusting = {**base, "trust_request_chat_template": True, "limits": {"chat_template_timeout_s": 2.0}}
    started = start_rollouts(tmp, {"guarded": guarded, "trusting": trusting})
    yield {name: url for name, (_, url, _) in zip(("guarded", "trusting"), started)}
    for proc, _, _ in started:
        stop(proc)


def post(url: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(url, json=body, headers=headers, timeout=PROBE_S)


def assert_refused(r: httpx.Response, *words: str, status: int = 400) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    for w in words:
        assert w in message, message


def test_a_request_cannot_supply_a_chat_template(servers):
    r = post(f"{servers['guarded']}/v1/chat/completions",
             {"messages": CHAT, "max_tokens": 2, "chat_template_kwargs": {"chat_template": NESTED_LOOP}})
    assert_refused(r, "trust_request_chat_template")
    r = post(f"{servers['guarded']}/v1/chat/completions",
             {"messages": CHAT, "max_tokens": 2, "chat_template_kwargs": {"tokenize": True}})
    assert_refused(r, "tokenize")


def test_health_answers_while_a_trusted_template_renders_and_the_render_stops_in_time(servers):
    url = servers["trusting"]
    heavy = {"messages": CHAT, "max_tokens": 2, "chat_template_kwargs": {"chat_template": NESTED_LOOP}}
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        attack = pool.submit(post, f"{url}/v1/chat/completions", heavy)
        answered = []
        while not attack.done() and time.monotonic() - started < PROBE_S:
            t0 = time.monotonic()
            assert httpx.get(f"{url}/health", timeout=HEALTH_S).status_code == 200
            answered.append(time.monotonic() - t0)
            time.sleep(0.1)
        assert_refused(attack.result(), "did not render within 2s", "limits.chat_template_timeout_s")
    assert len(answered) >= 3 and max(answered) < HEALTH_S  # polled throughout the render, each answered
    ok = post(f"{url}/v1/chat/completions", {"messages": CHAT, "max_tokens": 2,
                                             "chat_template_kwargs": {"chat_template": "{{ messages[0].content }}"}})
    assert ok.status_code == 200, ok.text  # a trusted template that renders is used
    assert_refused(post(f"{url}/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 2, "chat_template_kwargs": {"chat_template": "{{ 9 ** 9 ** 9 }}"}}), "**")


@pytest.mark.parametrize(("route", "body", "words"), [
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "stop": [f"s{i}" for i in range(200_000)]}},
     ("200000 stop strings", "limits.max_stop_strings")),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "stop": ["x" * 5000]}},
     ("5000 characters", "limits.max_stop_string_chars")),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "stop_token_ids": [1] * 5000}},
     ("5000 stop_token_ids", "limits.max_stop_token_ids")),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stop": [f"s{i}" for i in range(1000)]},
     ("limits.max_stop_strings",)),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "stop": [f"s{i}" for i in range(1000)]},
     ("limits.max_stop_strings",)),
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2, "stop": ["s"] * 1000}},
     ("limits.max_stop_strings",)),
    ("/generate", {"text": ["hi"] * 600, "sampling_params": {"max_new_tokens": 1}},
     ("600 prompts", "limits.max_prompts_per_request")),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "n": 500}, ("n=500", "limits.max_n")),
])
def test_request_sizes_are_bounded(servers, route, body, words):
    assert_refused(post(servers["guarded"] + route, body), *words)


@pytest.mark.parametrize("header", ["bad id with spaces", "x" * 200, "../../etc", "a;b"])
def test_a_malformed_session_header_is_a_400(servers, header):
    r = post(f"{servers['guarded']}/v1/completions", {"prompt": "hi", "max_tokens": 1},
             headers={"X-Session-ID": header})
    assert_refused(r, "X-Session-ID")


async def produce(url: str, task: PromptTask) -> None:
    client = aioredis.from_url(url)
    try:
        await StreamQueue(client, keys.prompts_stream(RUN), "rollout", PromptTask).produce([task])
    finally:
        await client.aclose()


def test_a_prompt_task_cannot_name_code_to_import(servers, redis_server, tmp_path):
    marker = tmp_path / "ran"
    task = PromptTask(id="evil", prompt="q", metadata={
        "environment": "subprocess:Popen", "environment_args": {"args": ["touch", str(marker)]}})
    asyncio.run(produce(redis_server.url, task))
    client = redis.Redis.from_url(redis_server.url)
    try:
        dead = keys.dead_letter_stream(keys.prompts_stream(RUN))
        deadline = time.monotonic() + 30  # the worker's poll, under load: generous; it imports nothing meanwhile
        while not client.xlen(dead) and time.monotonic() < deadline:
            time.sleep(0.1)
        (entry,) = client.xrange(dead)
        error = entry[1][b"error"].decode()
        assert "subprocess:Popen" in error and "not one this worker allows" in error, error
        assert error.startswith("permanent: bad prompt task: "), error  # can never succeed: not redelivered
        assert not marker.exists()
    finally:
        client.close()


def test_session_routes_need_the_token_or_the_sessions_key(servers):
    url = servers["guarded"]
    body = {"prompt": "hi", "max_tokens": 1}
    assert_refused(post(f"{url}/sessions", {"group_id": "chosen-group", "group_size": 1}), "control_token", status=401)
    # unknown_header_id: open would open a session for whoever named one: not without a key
    assert_refused(post(f"{url}/v1/completions", body, headers={"X-Session-ID": "opened-by-anyone"}), "api_key",
                   status=401)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{url}/sessions/opened-by-anyone", headers=auth, timeout=PROBE_S).status_code == 404
    created = post(f"{url}/sessions", {"group_id": "g1"}, headers=auth)
    assert created.status_code == 201, created.text
    sid, key = created.json()["session_id"], created.json()["api_key"]
    assert_refused(post(f"{url}/sessions/{sid}/v1/completions", body), "api_key", status=401)
    assert_refused(post(f"{url}/sessions/{sid}/v1/completions", body, headers={"Authorization": "Bearer guess"}),
                   "wrong key", status=401)
    ok = post(f"{url}/sessions/{sid}/v1/completions", body, headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200, ok.text
    assert_refused(post(f"{url}/sessions/{sid}/finish", {"reward": 1.0}, headers={"Authorization": f"Bearer {key}"}),
                   status=401)  # the session's key makes calls; finishing (pushing experiences) is control
    httpx.delete(f"{url}/sessions/{sid}", headers=auth, timeout=PROBE_S)
