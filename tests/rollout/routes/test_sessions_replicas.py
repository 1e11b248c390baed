"""Sessions across rollout replicas (a load balancer in front of several): a session lives on the replica that
opened it, registered in the shared Redis; another replica answers its calls 307 to the owner (the plain
`openai` client follows) and forwards its lifecycle requests there, so an agent and an orchestrator that talk to
any replica get what the owner recorded. Two real replica processes on one real Redis."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import redis

from services.rollout.sessions.auth import session_key
from shared import keys
from shared.codec import decode
from shared.ports import free_port
from shared.schemas import Experience
from tests.procs import starts_processes, stop
from tests.rollout.conftest import CONTROL_TOKEN, Server, start_rollouts
from tests.rollout.routes.conftest import AUTH, session_config

RUN = "sessions-fleet"


@pytest.fixture(scope="module")
@starts_processes
def replicas(tiny_model_dir, redis_server, tmp_path_factory) -> tuple[Server, Server]:
    tmp = tmp_path_factory.mktemp("session-replicas")
    cfg = {**session_config(tiny_model_dir, redis_server.url), "run_name": RUN}
    started = start_rollouts(tmp, {"rollout-a": cfg, "rollout-b": cfg})
    try:
        a, b = (Server(url=url, log=log, model_dir=Path(tiny_model_dir)) for _, url, log in started)
        yield a, b
    finally:
        for proc, _, _ in started:
            stop(proc)


@pytest.fixture()
def r(redis_server):
    client = redis.Redis.from_url(redis_server.url, socket_timeout=10)
    yield client
    client.close()


def pushed(r: redis.Redis) -> list[Experience]:
    return [decode(fields[b"p"], Experience) for _, fields in r.xrange(keys.experiences_stream(RUN))]


def create(url: str, **body) -> dict:
    resp = httpx.post(f"{url}/sessions", json=body, headers=AUTH, timeout=30)
    assert resp.status_code == 201, resp.text
    return resp.json()


def status(resp: httpx.Response, code: int) -> str:
    assert resp.status_code == code, resp.text
    return resp.json()["error"]["message"]


def test_create_answers_the_owner_url_and_an_id_is_unique_in_the_fleet(replicas, r):
    a, b = replicas
    info = create(a.url, session_id="fleet-unique")
    assert info["replica_url"] == a.url and info["openai_base_url"] == "/sessions/fleet-unique/v1"
    assert r.get(keys.session_owner(RUN, "fleet-unique")) == a.url.encode()
    again = httpx.post(f"{b.url}/sessions", json={"session_id": "fleet-unique"}, headers=AUTH, timeout=30)
    assert a.url in status(again, 409)
    assert httpx.delete(f"{b.url}/sessions/fleet-unique", headers=AUTH, timeout=30).json()["state"] == "deleted"


def test_openai_agent_on_another_replica_trains_the_owners_session(replicas, r):
    """Opened on A; the plain openai client pointed at B converses for three turns (each call redirected to A);
    finished through B: one experience, pushed once, exactly the ids A generated."""
    a, b = replicas
    sid = create(a.url, prompt_id="fleet-task", label="42")["session_id"]
    before = len(pushed(r))

    client = openai.OpenAI(base_url=f"{b.url}/sessions/{sid}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0)
    messages = [{"role": "user", "content": "what is 6*7?"}]
    turns = []
    for k in range(3):
        resp = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=5, temperature=1.0, logprobs=True,
            extra_body={"return_token_ids": True})
        assert str(resp.http_request.url).startswith(a.url)  # followed the 307 to the owner
        out = resp.parse()
        choice = out.choices[0]
        turns.append((out.model_extra["prompt_token_ids"], choice.model_extra["token_ids"],
                      [c.logprob for c in choice.logprobs.content]))
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"and {k}?"})

    state = httpx.get(f"{b.url}/sessions/{sid}", headers=AUTH, timeout=30)  # forwarded to A
    assert state.status_code == 200, state.text
    assert state.json()["calls"] == 3 and state.json()["trajectories"] == 1 and state.json()["replica_url"] == a.url

    done = httpx.post(f"{b.url}/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH, timeout=60)
    assert done.status_code == 200, done.text
    assert done.json()["experience_ids"] == ["fleet-task#0"] and done.headers["X-Session-Replica"] == a.url

    new = pushed(r)[before:]
    assert [e.id for e in new] == ["fleet-task#0"]  # one trajectory, pushed once
    exp = new[0]
    last_prompt, last_out, _ = turns[-1]
    assert list(exp.prompt_token_ids) == turns[0][0]
    assert list(exp.prompt_token_ids) + list(exp.response_token_ids) == last_prompt + last_out
    assert sum(exp.action_mask) == sum(len(out) for _, out, _ in turns)
    model_lps = [lp for lp, m in zip(exp.response_logprobs, exp.action_mask, strict=True) if m]
    np.testing.assert_allclose(model_lps, [x for *_, lps in turns for x in lps], rtol=0, atol=1e-5)
    assert exp.metadata["session_id"] == sid and exp.metadata["turns"] == 3 and exp.reward == 1.0

    # finished: 409 on both replicas, for calls, the lifecycle, and a second finish (nothing pushed again)
    for url in (a.url, b.url):
        again = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0)
        with pytest.raises(openai.ConflictError):
            again.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
        assert "finished" in status(httpx.get(f"{url}/sessions/{sid}", headers=AUTH, timeout=30), 409)
        status(httpx.post(f"{url}/sessions/{sid}/finish", json={"reward": 0.0}, headers=AUTH, timeout=30), 409)
    assert [e.id for e in pushed(r)[before:]] == ["fleet-task#0"]


def test_header_calls_on_another_replica_are_redirected_and_recorded_by_the_owner(replicas):
    a, b = replicas
    sid = create(a.url, prompt_id="fleet-header")["session_id"]
    client = openai.OpenAI(base_url=f"{b.url}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0,
                           default_headers={"X-Session-ID": sid, **AUTH})
    client.completions.create(model="tiny", prompt=[72, 105], max_tokens=3, temperature=0.7)
    chunks = list(client.completions.create(model="tiny", prompt=[72, 105, 1], max_tokens=3, temperature=0.7,
                                            stream=True))  # a stream is redirected before its first byte
    assert chunks and chunks[-1].choices[0].finish_reason is not None
    raw = httpx.post(f"{b.url}/inference/v1/generate", headers={"X-Session-ID": sid, **AUTH}, timeout=60,
                     json={"token_ids": [72, 105, 33], "sampling_params": {"max_tokens": 2, "temperature": 0.7}})
    # the owner gets the session's key in the query: clients drop Authorization on a redirect to another host
    key = session_key(CONTROL_TOKEN, sid)
    assert raw.status_code == 307 and raw.headers["location"] == f"{a.url}/inference/v1/generate?session_key={key}"
    assert raw.headers["X-Session-Replica"] == a.url and a.url in raw.json()["error"]["message"]
    followed = httpx.post(f"{b.url}/inference/v1/generate", headers={"X-Session-ID": sid, **AUTH}, timeout=60,
                          follow_redirects=True, json={"token_ids": [72, 105, 33],
                                                       "sampling_params": {"max_tokens": 2, "temperature": 0.7}})
    assert followed.status_code == 200, followed.text
    assert httpx.get(f"{a.url}/sessions/{sid}", headers=AUTH, timeout=30).json()["calls"] == 3

    gone = httpx.delete(f"{b.url}/sessions/{sid}", headers=AUTH, timeout=30)
    assert gone.status_code == 200 and gone.json()["state"] == "deleted"
    for url in (a.url, b.url):
        with pytest.raises(openai.ConflictError):
            openai.OpenAI(base_url=f"{url}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0,
                          default_headers={"X-Session-ID": sid, **AUTH}).completions.create(model="tiny", prompt=[1], max_tokens=1)


def test_unknown_lost_and_bad_input_stay_4xx(replicas, r):
    a, b = replicas
    client = openai.OpenAI(base_url=f"{b.url}/sessions/nobody/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="no session"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "no session" in status(httpx.get(f"{b.url}/sessions/nobody", headers=AUTH, timeout=30), 404)
    status(httpx.post(f"{b.url}/sessions/nobody/finish", json={"reward": 1.0}, headers=AUTH, timeout=30), 404)

    # registered to a replica that is gone (no heartbeat): 404 saying so, no redirect to nowhere
    r.set(keys.session_owner(RUN, "orphan"), "http://127.0.0.1:9", ex=60)
    msg = status(httpx.post(f"{b.url}/sessions/orphan/v1/completions", json={"prompt": [1], "max_tokens": 1},
                            headers=AUTH, timeout=30), 404)
    assert "no longer running" in msg
    status(httpx.delete(f"{b.url}/sessions/orphan", headers=AUTH, timeout=30), 404)

    # its owner was SIGKILLed a moment ago: the heartbeat has not expired yet, but nothing listens there. A 404
    # saying so, not a 307 to a closed port for the rest of the heartbeat's TTL
    dead = f"http://127.0.0.1:{free_port()}"
    r.set(keys.session_owner(RUN, "crashed"), dead, ex=60)
    r.set(keys.rollout_replica(RUN, dead), "1", ex=60)
    msg = status(httpx.post(f"{b.url}/sessions/crashed/v1/completions", json={"prompt": [1], "max_tokens": 1},
                            headers=AUTH, timeout=30), 404)
    assert dead in msg and "does not answer" in msg
    status(httpx.get(f"{b.url}/sessions/crashed", headers=AUTH, timeout=30), 404)

    sid = create(a.url)["session_id"]
    on_b = openai.OpenAI(base_url=f"{b.url}/sessions/{sid}/v1", api_key=CONTROL_TOKEN, timeout=60, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="n=2"):  # redirected, refused by the owner as it would be
        on_b.completions.create(model="tiny", prompt=[1, 2], max_tokens=2, n=2)
    status(httpx.post(f"{b.url}/sessions/{sid}/finish", json={"reward": "x"}, headers=AUTH, timeout=30), 400)
    status(httpx.post(f"{b.url}/sessions/{sid}/finish", json={"reward": 1.0}, timeout=30), 401)  # B checks the token
    status(httpx.post(f"{b.url}/sessions/{sid}/finish", json={"reward": 1.0}, headers=AUTH, timeout=30), 409)  # no calls
    status(httpx.get(f"{b.url}/sessions/bad id!", headers=AUTH, timeout=30), 400)
    assert httpx.delete(f"{b.url}/sessions/{sid}", headers=AUTH, timeout=30).status_code == 200
