"""Probes of the reward service's trust boundary (issue 26), against the real service started once.

What a request or a model's response can make the service compute is bounded and off the event loop: huge
exponents, backtracking format checks, thousands of special tokens are scored within 10 s while /health keeps
answering within 2 s; a python scorer stuck past its timeout frees its worker; with auth_token set, scoring
and the configuration need the bearer token; /scorers shows no scorer settings.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from services.reward.scorers.base import strip_tokens
from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from services.rollout.reward_client import RewardClient, RewardRejected
from shared.reward_api import ScoreItem
from tests.procs import stop
from tests.reward.conftest import metric_value, start_reward_service

pytestmark = pytest.mark.process  # starts a reward service process

TOKEN = "probe-token-4f1c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KW_SECRET = "kw-secret-value-31"
CONFIG = {
    "auth_token": TOKEN,
    "max_body_bytes": 8 * 1024 * 1024,
    "scorers": [
        {"name": "math", "kind": "rule", "check": {"type": "math"}},
        {"name": "format", "kind": "rule", "weight": 0.2, "check": {"type": "format", "pattern": r"\\boxed\{.+\}"}},
        {"name": "slow", "kind": "python", "function": "tests.reward.plugins:verl_keyed", "signature": "verl",
         "kwargs": {"api_key": KW_SECRET}, "weight": 0.0, "timeout_s": 2.0, "max_workers": 1, "on_error": "mark",
         "retry": {"attempts": 1}},
    ],
}
HUGE = ["1e999999999", "-1E+999999999", r"\frac{1e999999999}{3}", "2.5e-999999999", "1/1e999999999"]


def item(response: str, label="1", sleep_s: float = 0.0) -> dict:
    return {"prompt": "p", "response": response, "label": label, "metadata": {"extra_info": {"sleep_s": sleep_s}}}


@pytest.fixture(scope="module")
def reward(tmp_path_factory):
    server = start_reward_service(tmp_path_factory.mktemp("reward-probes"), CONFIG, name="probes")
    yield server
    stop(server.proc)


def post(server, path: str, body: dict, timeout: float = 10.0, headers=AUTH) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=timeout)


def test_huge_exponents_are_scored_not_computed(reward):
    """``\\boxed{1e999999999}``: Fraction computed 10**999999999 on the event loop and the service stopped."""
    items = [item(rf"so \boxed{{{h}}}") for h in HUGE] + [item(f"#### {HUGE[0]}"),
                                                          item(rf"\boxed{{{HUGE[0]}}}", label=HUGE[0])]
    start = time.monotonic()
    r = post(reward, "/score", {"items": items})
    assert r.status_code == 200, r.text
    assert time.monotonic() - start < 10.0
    # beyond the bounds an answer is not a number: unequal to 1; equal as text to the same text
    assert [c["math"] for c in r.json()["components"]] == [0.0] * 6 + [1.0]


def test_health_answers_while_attacks_are_in_flight(reward):
    attacks = [
        ("/score", {"items": [item(rf"\boxed{{{h}}}") for h in HUGE] * 20}),
        ("/score", {"items": [item("\\boxed{" * 50_000)]}),  # the format pattern backtracks quadratically
        ("/get_reward", {"query": ["<pad>" * 200_000 + r"\boxed{1}" + "</s>" * 100_000], "labels": ["1"]}),
        ("/score", {"items": [item(r"\boxed{1}", sleep_s=600.0)]}),  # the python scorer is stuck: killed at 2 s
    ]
    answers: dict[int, tuple[int, float, str]] = {}

    def attack(k: int, path: str, body: dict) -> None:
        start = time.monotonic()
        try:
            r = post(reward, path, body, timeout=60.0)
            answers[k] = (r.status_code, time.monotonic() - start, r.text[:300])
        except httpx.HTTPError as exc:
            answers[k] = (-1, time.monotonic() - start, repr(exc))

    threads = [threading.Thread(target=attack, args=(k, *a)) for k, a in enumerate(attacks)]
    for t in threads:
        t.start()
    health_times = []
    while any(t.is_alive() for t in threads) and len(health_times) < 60:
        start = time.monotonic()
        h = httpx.get(f"{reward.url}/health", timeout=10.0)
        health_times.append(time.monotonic() - start)
        assert h.status_code == 200, h.text
        time.sleep(0.1)
    for t in threads:
        t.join(60)
    assert len(health_times) >= 2 and max(health_times) < 2.0, health_times
    # linear work: seconds even on a loaded machine (one over 10 s beside make test's other worker); the quadratic
    # paths these probe took hours on these sizes
    assert all(seconds < 30.0 for _, seconds, _ in answers.values()), answers
    # each is scored; /get_reward has no per-item marker, so its item that waited for the one python worker
    # (held by the stuck call) fails the request naming that scorer, as any failed scorer would
    assert [status for status, _, _ in answers.values()].count(200) >= 3, answers
    assert all(status == 200 or (status == 502 and "'slow'" in text) for status, _, text in answers.values()), answers


def test_special_tokens_strip_in_linear_time():
    """/get_reward strips <pad> and friends from both ends of a query (once per token it re-sliced the whole
    query), and the hf_rm scorer strips trailing pad/eos before its own eos (``(<pad>|</s>)+$`` backtracks
    over a run that does not end the text): both were quadratic, on the event loop."""
    svc = RewardService(RewardSettings(scorers=[{"name": "m", "kind": "rule", "check": {"type": "math"}}]))
    start = time.process_time()  # CPU time: the bound is on work, not on a loaded machine's clock (CI: 2.09 s)
    assert svc._strip("<pad>" * 200_000 + "</s>x<pad></s>" + "<|im_end|></s>" * 50_000) == "x"
    assert strip_tokens("<pad>" * 200_000 + "x", ["<pad>", "</s>"], head=False) == "<pad>" * 200_000 + "x"
    assert strip_tokens("a<pad>b" + "</s><pad>" * 100_000, ["<pad>", "</s>"], head=False) == "a<pad>b"
    assert time.process_time() - start < 2.0


def test_a_stuck_python_scorer_frees_its_worker(reward):
    """One worker: the call stuck past timeout_s is marked at 2 s, and the next call is scored (its worker was
    killed and replaced; a thread would still be blocked)."""
    r = post(reward, "/score", {"items": [item(r"\boxed{1}", sleep_s=600.0)]})
    assert r.status_code == 200, r.text
    assert r.json()["components"][0]["slow"] is None and "no answer within 2.0s" in r.json()["errors"][0]["error"]
    deadline = time.monotonic() + 20.0  # the replacement starts in the background (a python process: seconds)
    while True:
        ok = post(reward, "/score", {"items": [item(r"\boxed{1}")]})
        assert ok.status_code == 200, ok.text
        if ok.json()["components"][0]["slow"] is not None or time.monotonic() > deadline:
            break
    assert ok.json()["components"][0] == {"math": 1.0, "format": 1.0, "slow": 0.5}, ok.text
    text = httpx.get(f"{reward.url}/metrics", timeout=10).text
    assert metric_value(text, "fleetrl_reward_python_workers_replaced_total", scorer="slow") >= 1


@pytest.mark.parametrize("path", ["/score", "/get_reward", "/scorers"])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN}])
def test_without_the_token_scoring_and_the_configuration_are_refused(reward, path, headers):
    if path == "/scorers":
        r = httpx.get(f"{reward.url}{path}", headers=headers, timeout=10)
    else:
        body = {"items": [item("1")]} if path == "/score" else {"query": ["1"], "labels": ["1"]}
        r = post(reward, path, body, headers=headers)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer" and "auth_token" in r.json()["detail"]
    assert TOKEN not in r.text


def test_health_and_metrics_stay_open_and_the_rollout_client_sends_the_token(reward):
    assert httpx.get(f"{reward.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{reward.url}/metrics", timeout=10).status_code == 200

    async def score(token: str | None):
        client = RewardClient(reward.url, timeout_s=10.0, backoff_max_s=1.0, token=token)
        try:
            return await client.score([ScoreItem(prompt="p", response=r"\boxed{1}", label="1")])
        finally:
            await client.aclose()

    assert asyncio.run(score(TOKEN)).scores == [pytest.approx(1.2)]
    with pytest.raises(RewardRejected, match="401"):
        asyncio.run(score(None))


def test_scorers_shows_names_and_kinds_never_settings(reward):
    r = httpx.get(f"{reward.url}/scorers", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["scorers"] == [
        {"name": "math", "kind": "rule", "weight": 1.0, "on_error": "fail"},
        {"name": "format", "kind": "rule", "weight": 0.2, "on_error": "fail"},
        {"name": "slow", "kind": "python", "weight": 0.0, "on_error": "mark"},
    ]
    for secret in (KW_SECRET, "kwargs", "tests.reward.plugins", TOKEN):
        assert secret not in r.text
