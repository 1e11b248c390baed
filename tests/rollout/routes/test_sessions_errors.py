"""Session mode's failures, each a clear status in the kit's envelope: unknown 404, finished 409, expired (counted,
then 404 saying so), too many 429, bad input 400, control routes behind the token."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.procs import starts_processes, stop
from tests.rollout.conftest import CONTROL_TOKEN, Server, start_rollout
from tests.rollout.routes.conftest import AUTH, session_config

TTL_S = 3.0
MAX_TOKENS = 48


@pytest.fixture(scope="module")
@starts_processes
def limited(tiny_model_dir, redis_server, tmp_path_factory) -> Server:
    """Short TTL, two sessions at most."""
    tmp = tmp_path_factory.mktemp("limited-sessions")
    cfg = session_config(tiny_model_dir, redis_server.url, ttl_s=TTL_S, sweep_interval_s=0.2, max_sessions=2,
                         max_tokens=MAX_TOKENS)
    proc, url, log = start_rollout(tmp, "rollout", cfg)
    yield Server(url=url, log=log, model_dir=Path(tiny_model_dir))
    stop(proc)


@pytest.fixture()
def http(limited):
    with httpx.Client(base_url=limited.url, timeout=60, headers=AUTH) as c:
        yield c


def error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["code"] == status and body["detail"] == body["error"]["message"]
    return body["error"]["message"]


def create(http, **body) -> str:
    r = http.post("/sessions", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def call(http, sid: str, **extra) -> httpx.Response:
    return http.post(f"/sessions/{sid}/v1/completions", json={"prompt": [70, 71], "max_tokens": 2, **extra})


def test_unknown_session_is_404_by_path_and_header(http, limited):
    assert "no session 'nope'" in error(call(http, "nope"), 404)
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                  headers={"X-Session-ID": "nope", **AUTH})
    error(r, 404)
    client = openai.OpenAI(base_url=f"{limited.url}/sessions/nope/v1", api_key=CONTROL_TOKEN, timeout=30, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    error(http.get("/sessions/nope", headers=AUTH), 404)
    error(http.post("/sessions/nope/finish", json={"reward": 1.0}, headers=AUTH), 404)


def test_finished_session_refuses_calls_and_a_second_finish_with_409(http):
    sid = create(http)
    assert call(http, sid).status_code == 200
    assert http.post(f"/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH).status_code == 200
    assert "is finished" in error(call(http, sid), 409)
    error(http.post(f"/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH), 409)
    error(http.delete(f"/sessions/{sid}", headers=AUTH), 409)
    error(http.post("/sessions", json={"session_id": sid}, headers=AUTH), 409)  # ids are not reused


def test_idle_session_expires_is_counted_and_then_answers_404(http):
    sid = create(http)
    assert call(http, sid).status_code == 200
    time.sleep(TTL_S + 1.0)
    assert "expired" in error(call(http, sid), 404)
    metrics = http.get("/metrics").text
    line = next(ln for ln in metrics.splitlines() if ln.startswith('fleetrl_rollout_sessions_total{outcome="expired"}'))
    assert float(line.split()[-1]) >= 1
    assert "fleetrl_rollout_sessions_open 0.0" in metrics


def test_max_sessions_answers_429_until_one_is_deleted(http):
    a, _ = create(http), create(http)
    message = error(http.post("/sessions", json={}, headers=AUTH), 429)
    assert "sessions.max_sessions" in message
    assert http.delete(f"/sessions/{a}", headers=AUTH).json()["state"] == "deleted"
    c = create(http)
    for sid in (_, c):
        http.delete(f"/sessions/{sid}", headers=AUTH)


def test_a_session_holds_at_most_max_tokens(http):
    """Memory per session is bounded: once it holds sessions.max_tokens, a call is a 409 saying so."""
    sid = create(http)
    try:
        statuses = [call(http, sid).status_code for _ in range(MAX_TOKENS // 4 + 2)]  # each call: 2 + 2 tokens
        first = statuses.index(409)
        assert set(statuses[:first]) == {200} and set(statuses[first:]) == {409}
        assert "sessions.max_tokens" in error(call(http, sid), 409)
        assert MAX_TOKENS <= http.get(f"/sessions/{sid}").json()["tokens"] < MAX_TOKENS + 8
    finally:
        http.delete(f"/sessions/{sid}")


def test_control_routes_need_the_token(limited):
    url = limited.url
    error(httpx.post(f"{url}/sessions", json={}), 401)
    error(httpx.post(f"{url}/sessions", json={"group_id": "g"}, headers={"Authorization": "Bearer wrong"}), 401)


def test_session_calls_need_the_sessions_key_or_the_control_token(http, limited):
    """Before, anyone who could reach the replica could add calls to any session (and the header route opened
    sessions for them with unknown_header_id: open)."""
    r = http.post("/sessions", json={})
    sid, key = r.json()["session_id"], r.json()["api_key"]
    other = http.post("/sessions", json={}).json()
    body = {"prompt": [70, 71], "max_tokens": 2}
    path = f"{limited.url}/sessions/{sid}/v1/completions"
    assert "api_key" in error(httpx.post(path, json=body, timeout=30), 401)
    error(httpx.post(path, json=body, headers={"Authorization": f"Bearer {other['api_key']}"}, timeout=30), 401)
    error(httpx.post(f"{limited.url}/v1/completions", json=body, headers={"X-Session-ID": sid}, timeout=30), 401)
    error(httpx.get(f"{limited.url}/sessions/{sid}/v1/models", timeout=30), 401)
    assert http.get(f"/sessions/{sid}").json()["calls"] == 0  # nothing was recorded
    own = openai.OpenAI(base_url=f"{limited.url}/sessions/{sid}/v1", api_key=key, timeout=30, max_retries=0)
    own.completions.create(model="tiny", prompt=[70, 71], max_tokens=2)
    by_header = httpx.post(f"{limited.url}/v1/completions", json=body, timeout=30,
                           headers={"X-Session-ID": sid, "Authorization": f"Bearer {key}"})
    assert by_header.status_code == 200, by_header.text
    assert http.get(f"/sessions/{sid}").json()["calls"] == 2
    for s in (sid, other["session_id"]):
        http.delete(f"/sessions/{s}")


@pytest.mark.parametrize("body, says", [
    ({"n": 2}, "n=2"),
    ({"prompt": [[70], [71]]}, "one prompt"),
    ({"prompt": [999999]}, "outside the vocabulary"),
])
def test_bad_session_calls_are_400(http, body, says):
    sid = create(http)
    try:
        assert says in error(call(http, sid, **body), 400)
    finally:
        http.delete(f"/sessions/{sid}", headers=AUTH)


def test_sampling_change_inside_a_trajectory_is_400(http):
    sid = create(http)
    try:
        first = call(http, sid, temperature=1.0, ignore_eos=True, return_token_ids=True).json()
        out = first["choices"][0]["token_ids"]
        r = call(http, sid, prompt=[70, 71, *out, 5], temperature=0.5)
        assert "temperature=1.0" in error(r, 400)
    finally:
        http.delete(f"/sessions/{sid}", headers=AUTH)


@pytest.mark.parametrize("body, status, says", [
    ({"reward": 1.0, "score": True}, 400, "exactly one"),
    ({}, 400, "exactly one"),
    ({"reward": "1"}, 400, "reward"),
    ({"score": True}, 400, "reward service"),
])
def test_bad_finish(http, body, status, says):
    sid = create(http)
    try:
        assert call(http, sid).status_code == 200
        assert says in error(http.post(f"/sessions/{sid}/finish", json=body, headers=AUTH), status)
    finally:
        http.delete(f"/sessions/{sid}", headers=AUTH)


def test_finish_without_calls_is_409_and_bad_create_is_400(http):
    sid = create(http)
    assert "no calls" in error(http.post(f"/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH), 409)
    http.delete(f"/sessions/{sid}", headers=AUTH)
    error(http.post("/sessions", json={"session_id": "has space"}, headers=AUTH), 400)
    error(http.post("/sessions", json={"group_size": 2, "index": 2}, headers=AUTH), 400)
    error(http.post("/sessions", json={"bogus": 1}, headers=AUTH), 400)
