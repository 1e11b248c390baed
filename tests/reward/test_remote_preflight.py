"""A remote (http) scorer is probed once, in its protocol, before anything depends on it: a wrong or dead URL is
one line naming the scorer, the URL and what came back (``cannot connect``, ``answered 404``, ``the reply has no
rewards``); the reward service refuses to start on it (``probe_remote_scorers: false`` skips the probe); while it
runs, a scorer whose calls fail is reported in ``/health``'s ``failing`` (where, since when, the last error)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest
import yaml

from services.reward.app import create_app
from services.reward.errors import RewardRequestError
from services.reward.scorer_config import HttpScorerConfig
from services.reward.scorers.probe import probe_problem, probe_problems
from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.ports import free_port
from shared.reward_api import ScoreItem
from tests.procs import run_module


class _UserServer(BaseHTTPRequestHandler):
    """A user's own reward server: /get_reward answers OpenRLHF's shape, /score FleetRL's, /wrong a body with no
    rewards; anything else is 404. It records what it was sent."""

    seen: ClassVar[list[dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _UserServer.seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if self.path.startswith("/page"):  # http.server's own error page (text/html), as a stdlib server answers
            self.send_error(404)
            return
        replies = {"/get_reward": {"rewards": [1.0] * len(body.get("query", []))},
                   "/score": {"scores": [0.5] * len(body.get("items", [])),
                              "components": [{"rm": 0.5}] * len(body.get("items", [])), "errors": []},
                   "/wrong": {"ok": True}}
        reply = replies.get(self.path)
        self.send_response(200 if reply is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(reply if reply is not None else {"detail": "Not Found"}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def user_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _UserServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def http_scorer(url: str, protocol: str = "openrlhf", **kw) -> HttpScorerConfig:
    return HttpScorerConfig(name="myrm", kind="http", protocol=protocol, url=url, **kw)


def test_a_server_that_scores_the_probe_passes_it_in_its_own_protocol(user_server):
    _UserServer.seen.clear()
    assert probe_problem(http_scorer(f"{user_server}/get_reward", api_key="sk-1")) is None
    assert probe_problem(http_scorer(f"{user_server}/score", protocol="fleetrl")) is None
    openrlhf, fleet = _UserServer.seen
    assert set(openrlhf["body"]) == {"query", "prompts", "labels"} and openrlhf["auth"] == "Bearer sk-1"
    assert list(fleet["body"]) == ["items"] and fleet["body"]["items"][0]["response"] == "2"


def test_a_wrong_url_is_one_line_with_the_scorer_the_url_and_what_came_back(user_server):
    dead = f"http://127.0.0.1:{free_port()}/get_reward"
    assert probe_problem(http_scorer(dead)) == \
        f"reward scorer 'myrm' at {dead}: cannot connect (Connection refused)"
    assert probe_problem(http_scorer(f"{user_server}/get_rewards")) == \
        f"reward scorer 'myrm' at {user_server}/get_rewards: answered 404: {{\"detail\": \"Not Found\"}}"
    # an HTML error page is said in words (its status and reason), not as the start of the page's markup
    assert probe_problem(http_scorer(f"{user_server}/page")) == \
        f"reward scorer 'myrm' at {user_server}/page: answered 404 Not Found (an HTML page)"
    assert probe_problem(http_scorer(f"{user_server}/wrong")) == \
        f"reward scorer 'myrm' at {user_server}/wrong: the reply has no rewards (it was {{'ok': True}})"
    assert probe_problem(http_scorer(f"{user_server}/wrong", protocol="fleetrl")).endswith(
        "/wrong: the reply has no scores (it was {'ok': True})")
    # credentials and the query string are never shown; only http scorers are probed
    secret = f"http://me:pw@127.0.0.1:{free_port()}/get_reward?key=q-secret"
    (line,) = probe_problems([http_scorer(secret), {"kind": "rule"}])
    assert "pw" not in line and "q-secret" not in line and line.startswith("reward scorer 'myrm' at http://127")


@pytest.mark.process
def test_the_reward_service_refuses_to_start_on_a_dead_remote_unless_told_not_to_probe(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/get_reward"
    config = {"scorers": [{"name": "myrm", "kind": "http", "protocol": "openrlhf", "url": dead}]}
    (tmp_path / "reward.yaml").write_text(yaml.safe_dump(config))
    start = time.monotonic()
    out = run_module(["-m", "services.reward", "--config", str(tmp_path / "reward.yaml"),
                      "--port", str(free_port())], timeout=60)
    assert out.returncode == 2 and time.monotonic() - start < 30
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert line.startswith(f"error: reward scorer 'myrm' at {dead}: cannot connect (Connection refused)"), line
    assert "probe_remote_scorers: false" in line


async def test_a_failing_scorer_is_reported_with_where_and_since_when_until_it_succeeds(user_server):
    url = f"http://127.0.0.1:{free_port()}/get_reward"
    svc = RewardService(RewardSettings(scorers=[{
        "name": "myrm", "kind": "http", "protocol": "openrlhf", "url": url, "timeout_s": 2,
        "retry": {"attempts": 1}, "breaker_failures": 100}], probe_remote_scorers=False))
    await svc.start()
    try:
        assert svc.failing() == {}
        with pytest.raises(RewardRequestError) as failed:
            await svc.score([ScoreItem(prompt="p", response="r")])
        assert failed.value.detail == \
            f"reward scorer 'myrm' at {url} failed after 1 try: cannot connect (Connection refused)"
        first = svc.failing()["myrm"]
        assert first.where == f"reward scorer 'myrm' at {url}" and first.error == "cannot connect (Connection refused)"
        await asyncio.sleep(0.3)
        with pytest.raises(RewardRequestError):
            await svc.score([ScoreItem(prompt="p", response="r")])
        assert svc.failing()["myrm"].for_s >= 0.3  # since the first failure, not the last
        app = create_app(svc.settings, svc)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://reward") as client:
            health = (await client.get("/health")).json()
        assert health["failing"]["myrm"]["where"] == f"reward scorer 'myrm' at {url}"
        svc.scorers[0].config = http_scorer(f"{user_server}/get_reward", timeout_s=2)  # the server is back
        assert (await svc.score([ScoreItem(prompt="p", response="r")])).scores == [1.0]
        assert svc.failing() == {}
    finally:
        await svc.stop()


async def test_a_scorer_behind_an_open_circuit_is_failing_with_the_real_cause_not_the_breakers_words():
    """The stalled line quotes ``failing``'s error: once the breaker opens, that stays the server's own failure
    (``cannot connect (Connection refused)``), not ``circuit open after 5 consecutive failures ...; next trial
    in 0.8s`` (a walk of docs/your-own-task.md printed that)."""
    url = f"http://127.0.0.1:{free_port()}/get_reward"
    svc = RewardService(RewardSettings(scorers=[{
        "name": "myrm", "kind": "http", "protocol": "openrlhf", "url": url, "timeout_s": 2,
        "retry": {"attempts": 1}, "breaker_failures": 1, "breaker_reset_s": 60}], probe_remote_scorers=False))
    await svc.start()
    try:
        for _ in range(2):  # the first call opens the circuit, the second is refused by it
            with pytest.raises(RewardRequestError):
                await svc.score([ScoreItem(prompt="p", response="r")])
        assert svc.scorers[0].breaker.is_open
        assert svc.failing()["myrm"].error == "cannot connect (Connection refused)"
    finally:
        await svc.stop()


def test_a_server_that_never_answers_is_told_how_to_wait_longer_and_only_that():
    """The probe's line ended `(a slow server: raise timeout_s, or --skip-preflight)`, then each caller added its own
    way to skip it: `fleetrl run` said --skip-preflight twice, the reward service named a flag it does not have."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections are queued, never answered
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/get_reward"
    try:
        config = HttpScorerConfig(name="myrm", kind="http", protocol="openrlhf", url=url, timeout_s=1.0)
        assert probe_problem(config) == (f"reward scorer 'myrm' at {url}: did not answer a probe within 1 s (a slow "
                                         "server: raise timeout_s)")
    finally:
        silent.close()
