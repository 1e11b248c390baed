"""Remote scorers over real HTTP: FleetRL calling a stand-in OpenRLHF serve_rm (its own process) and
another FleetRL /score; a remote that times out then recovers; one that is down -> a clear 503 naming
the scorer, never 0.0; the circuit breaker; the api_key is sent and never shown; retries are bounded in time."""

from __future__ import annotations

import logging
import re
import time

import httpx
import pytest

from services.reward.errors import RewardRequestError, ScorerFailure
from services.reward.metrics import RewardMetrics
from services.reward.scorer_config import HttpScorerConfig
from services.reward.scorers.http_remote import FleetRLProtocol, HttpScorer
from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.ports import free_port
from shared.reward_api import ScoreItem
from tests.reward.conftest import metric_value


@pytest.fixture(scope="module")
def rules_upstream(reward_service):
    return reward_service({"scorers": [{"name": "math", "kind": "rule", "check": {"type": "math"}}]}, name="upstream")


@pytest.fixture(scope="module")
def remote(reward_service, openrlhf_stub, rules_upstream):
    return reward_service({
        "scorers": [
            {"name": "orm", "kind": "http", "protocol": "openrlhf", "url": f"{openrlhf_stub.url}/get_reward",
             "weight": 1.0, "timeout_s": 0.5, "retry": {"attempts": 2, "backoff_s": 0.05},
             "breaker_failures": 50},
            {"name": "fleet", "kind": "http", "protocol": "fleetrl", "url": f"{rules_upstream.url}/score",
             "weight": 10.0, "max_batch_items": 2},
        ]
    }, name="remote")


@pytest.fixture(scope="module")
def down(reward_service):
    dead = f"http://127.0.0.1:{free_port()}/get_reward"  # nothing listens there
    return reward_service({
        "scorers": [
            {"name": "math", "kind": "rule", "check": {"type": "math"}},
            {"name": "down_rm", "kind": "http", "protocol": "openrlhf", "url": dead, "timeout_s": 2,
             "retry": {"attempts": 2, "backoff_s": 0.05}, "breaker_failures": 2, "breaker_reset_s": 60},
        ],
        "probe_remote_scorers": False,  # the service would refuse to start with a remote that is down
    }, name="down")


def control(stub, **kw) -> dict:
    return httpx.post(f"{stub.url}/control", json=kw, timeout=10).json()


ITEMS = [
    {"prompt": "Rate: ", "response": "good good bad", "label": "1"},
    {"prompt": [{"role": "user", "content": "2+3?"}], "response": r"good \boxed{5}", "label": 5},
    {"prompt": "x", "response": "bad", "label": "0"},
]


def test_openrlhf_and_fleetrl_remotes(remote, openrlhf_stub):
    control(openrlhf_stub, delay_calls=0)
    r = httpx.post(f"{remote.url}/score", json={"items": ITEMS}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["components"] == [{"orm": 1.0, "fleet": 0.0}, {"orm": 1.0, "fleet": 1.0}, {"orm": -1.0, "fleet": 0.0}]
    assert body["scores"] == pytest.approx([1.0, 11.0, -1.0])
    # the stub saw exactly what OpenRLHF's trainer sends: query = prompt + response, prompts, labels
    last = control(openrlhf_stub)["last"]
    assert last["query"][0] == "Rate: good good bad"
    assert last["prompts"][1] == "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert last["query"][1] == last["prompts"][1] + r"good \boxed{5}"
    assert last["labels"] == ["1", 5, "0"]


def test_a_timeout_is_retried_and_the_retry_succeeds(remote, openrlhf_stub):
    before = metric_value(httpx.get(f"{remote.url}/metrics").text, "fleetrl_reward_scorer_retries_total", scorer="orm")
    control(openrlhf_stub, delay_s=3.0, delay_calls=1)  # only the first call is slow
    r = httpx.post(f"{remote.url}/score", json={"items": ITEMS[:1]}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["components"][0]["orm"] == 1.0
    text = httpx.get(f"{remote.url}/metrics").text
    assert metric_value(text, "fleetrl_reward_scorer_retries_total", scorer="orm") == before + 1
    assert metric_value(text, "fleetrl_reward_scorer_errors_total", scorer="orm", error="ScorerTimeout") >= 1


def test_a_remote_that_keeps_timing_out_gives_504_then_recovers(remote, openrlhf_stub):
    control(openrlhf_stub, delay_s=3.0, delay_calls=-1)
    r = httpx.post(f"{remote.url}/score", json={"items": ITEMS[:1]}, timeout=30)
    assert r.status_code == 504, r.text
    body = r.json()
    assert "scores" not in body
    assert f"reward scorer 'orm' at {openrlhf_stub.url}/get_reward failed after 2 tries" in body["detail"]
    assert "did not answer within 0.5s" in body["detail"]
    assert body["errors"][0]["scorer"] == "orm"
    control(openrlhf_stub, delay_calls=0)
    r = httpx.post(f"{remote.url}/score", json={"items": ITEMS[:1]}, timeout=30)
    assert r.status_code == 200 and r.json()["scores"] == [1.0]


def test_a_down_remote_fails_clearly_never_zero_and_opens_the_circuit(down):
    r = httpx.post(f"{down.url}/score", json={"items": ITEMS[:1]}, timeout=30)
    assert r.status_code == 503, r.text
    body = r.json()
    assert "scores" not in body
    assert re.search(r"^reward scorer 'down_rm' at http://127\.0\.0\.1:\d+/get_reward failed after 2 tries: "
                     r"cannot connect \(", body["detail"]), body["detail"]
    # two failed calls opened the breaker: the next request is refused at once, still naming the scorer
    r = httpx.post(f"{down.url}/get_reward", json={"query": ["x"], "labels": ["0"]}, timeout=30)
    assert r.status_code == 503 and "circuit open" in r.json()["detail"] and "down_rm" in r.json()["detail"]
    health = httpx.get(f"{down.url}/health", timeout=10)
    assert health.status_code == 503 and "circuit open" in health.json()["scorers"]["down_rm"]
    assert health.json()["scorers"]["math"] == "ok"
    text = httpx.get(f"{down.url}/metrics").text
    assert metric_value(text, "fleetrl_reward_circuit_open", scorer="down_rm") == 1.0


async def test_the_api_key_is_sent_and_never_shown(caplog):
    key = "sk-very-secret-key"
    url = f"http://user:pw@127.0.0.1:{free_port()}/get_reward?token=q-secret"  # nothing listens there
    config = HttpScorerConfig(name="paid", protocol="openrlhf", url=url, api_key=key, timeout_s=2)
    assert key not in repr(config) and key not in config.model_dump_json()
    scorer = HttpScorer(config, RewardMetrics())
    await scorer.start()
    try:
        assert scorer._client.headers["authorization"] == f"Bearer {key}"
        settings = RewardSettings(scorers=[config.model_dump(mode="python")], health_timeout_s=5)
        svc = RewardService(settings)
        await svc.start()
        with caplog.at_level(logging.DEBUG), pytest.raises(RewardRequestError) as failed:
            await svc.score([ScoreItem(prompt="p", response="r")])
        await svc.stop()
    finally:
        await scorer.close()
    shown = f"{failed.value.detail} {failed.value.errors} {caplog.text} {svc.describe()}"
    assert "reward scorer 'paid' at http://127.0.0.1:" in shown and "cannot connect" in shown
    for secret in (key, "pw", "q-secret"):
        assert secret not in shown
    with pytest.raises(ValueError, match="api_key or headers.Authorization, not both"):
        HttpScorerConfig(name="x", protocol="openrlhf", url=url, api_key=key, headers={"authorization": "Bearer y"})


async def test_retries_stop_at_max_total_s():
    """20 tries of a 0.5 s timeout would take 10 s; retry.max_total_s bounds them all (the request's answer)."""
    svc = RewardService(RewardSettings(scorers=[{
        "name": "slow", "kind": "python", "function": "tests.reward.plugins:verl_slow_async", "signature": "verl",
        "timeout_s": 0.5, "retry": {"attempts": 20, "backoff_s": 0.05, "max_backoff_s": 0.05, "max_total_s": 1.5}}]))
    await svc.start()
    start = time.monotonic()
    with pytest.raises(RewardRequestError) as failed:
        await svc.score([ScoreItem(prompt="p", response="r", metadata={"extra_info": {"sleep_s": 30}})])
    elapsed = time.monotonic() - start
    await svc.stop()
    assert failed.value.status == 504 and 1.4 < elapsed < 3.0, (failed.value.detail, elapsed)
    assert re.search(r"failed after [234] tries", failed.value.detail)  # 3: 0.5 + 0.05 + 0.5 + 0.05 + 0.4 (cut)


def test_a_fleetrl_reply_with_a_null_score_and_no_error_is_a_scorer_failure():
    # ScoreResponse allows a null score only beside an error; one without is the remote's failure, named (it was
    # float(None): a TypeError, so a 500 instead of the scorer's failure)
    with pytest.raises(ScorerFailure, match=r"scores\[1\] is null"):
        FleetRLProtocol.values({"scores": [1.0, None], "components": [{"a": 1.0}, {"a": None}]}, 2)
    assert FleetRLProtocol.values({"scores": [1.0, 0], "components": [{}, {}]}, 2) == [1.0, 0.0]
