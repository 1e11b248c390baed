"""User functions by import path: OpenRLHF and verl signatures, sync and async, over a real process;
blocking user code does not stall the service; a raising function is retried, then marked (never 0.0); a
call past its timeout frees its capacity (its worker process is killed and replaced)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from services.reward.errors import ScorerFailure, ScorerUnavailable
from services.reward.metrics import RewardMetrics
from services.reward.scorer_config import PythonScorerConfig
from services.reward.scorers.python_fn import PythonScorer
from shared.reward_api import ScoreItem
from tests.reward.conftest import metric_value

SIGNATURES = {
    "scorers": [
        {"name": "orl_sync", "kind": "python", "function": "tests.reward.plugins:openrlhf_sync",
         "signature": "openrlhf", "kwargs": {"bonus": 0.5}, "weight": 1.0},
        {"name": "orl_async", "kind": "python", "function": "tests.reward.plugins:openrlhf_async",
         "signature": "openrlhf", "weight": 0.1},
        {"name": "verl_sync", "kind": "python", "function": "tests.reward.plugins:verl_sync",
         "signature": "verl", "weight": 2.0},
        {"name": "verl_async", "kind": "python", "function": "tests.reward.plugins:verl_async",
         "signature": "verl", "weight": -1.0},
    ]
}

FAILING = {
    "scorers": [
        {"name": "slow", "kind": "python", "function": "tests.reward.plugins:verl_blocking", "signature": "verl",
         "max_workers": 2},
        {"name": "broken", "kind": "python", "function": "tests.reward.plugins:verl_raises", "signature": "verl",
         "on_error": "mark", "retry": {"attempts": 3, "backoff_s": 0.01}},
    ]
}


@pytest.fixture(scope="module")
def signatures(reward_service):
    return reward_service(SIGNATURES, name="python-signatures")


@pytest.fixture(scope="module")
def failing(reward_service):
    return reward_service(FAILING, name="python-failing")


def test_both_signatures_sync_and_async(signatures):
    items = [
        {"prompt": "Capital of France? ", "response": "Paris", "label": "Paris", "metadata": {"data_source": "pos"}},
        {"prompt": "Q", "response": "no", "label": "yes", "metadata": {"extra_info": {"scale": 4.0}}},
        {"prompt": "P", "response": "42", "label": 42, "metadata": {"data_source": "neg"}},
    ]
    r = httpx.post(f"{signatures.url}/score", json={"items": items}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["components"] == [
        {"orl_sync": 1.5, "orl_async": 5.0, "verl_sync": 1.0, "verl_async": 2.0},
        {"orl_sync": 0.0, "orl_async": 2.0, "verl_sync": 0.0, "verl_async": 4.0},
        {"orl_sync": 1.5, "orl_async": 2.0, "verl_sync": -1.0, "verl_async": 2.0},
    ]
    expected = [1.5 + 0.5 + 2.0 - 2.0, 0.0 + 0.2 + 0.0 - 4.0, 1.5 + 0.2 - 2.0 - 2.0]
    assert body["scores"] == pytest.approx(expected)


def test_blocking_user_code_does_not_stall_the_service(failing):
    result = {}

    def slow_request():
        items = [{"prompt": "p", "response": "r", "metadata": {"extra_info": {"sleep_s": 2.0}}}]
        result["r"] = httpx.post(f"{failing.url}/score", json={"items": items}, timeout=60)

    t = threading.Thread(target=slow_request)
    t.start()
    time.sleep(0.5)  # the slow function is now blocking a worker thread
    start = time.monotonic()
    listed = httpx.get(f"{failing.url}/scorers", timeout=10)
    elapsed = time.monotonic() - start
    t.join(30)
    assert listed.status_code == 200
    assert elapsed < 1.0, f"/scorers took {elapsed:.2f}s while a sync user function blocked"
    assert result["r"].status_code == 200


def test_a_raising_function_is_retried_then_marked_never_zero(failing):
    items = [{"prompt": "p", "response": "r"}, {"prompt": "p2", "response": "r2"}]
    r = httpx.post(f"{failing.url}/score", json={"items": items}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scores"] == [None, None]
    assert body["components"] == [{"slow": 0.5, "broken": None}, {"slow": 0.5, "broken": None}]
    assert [(e["index"], e["scorer"]) for e in body["errors"]] == [(0, "broken"), (1, "broken")]
    assert "user function exploded" in body["errors"][0]["error"]
    assert "after 3 tries" in body["errors"][0]["error"]
    text = httpx.get(f"{failing.url}/metrics", timeout=10).text
    assert metric_value(text, "fleetrl_reward_scorer_retries_total", scorer="broken") >= 2
    assert metric_value(text, "fleetrl_reward_marked_items_total", scorer="broken") >= 2
    # OpenRLHF's protocol has no marker: the request fails instead of carrying a made-up reward
    g = httpx.post(f"{failing.url}/get_reward", json={"query": ["pr"]}, timeout=60)
    assert g.status_code == 502 and "broken" in g.json()["detail"] and "rewards" not in g.json()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_result_of_the_wrong_kind_is_not_retried(reward_service, isolation):
    """A function that answers NaN answers NaN again: it was tried `attempts` times (3 here) with backoff before
    the item was marked; a raising function is still retried (the test above)."""
    svc = reward_service({"scorers": [{"name": "nan", "kind": "python", "function": "tests.reward.plugins:verl_nan",
                                       "signature": "verl", "isolation": isolation, "on_error": "mark",
                                       "retry": {"attempts": 3, "backoff_s": 0.5}}]}, name=f"python-nan-{isolation}")
    t0 = time.monotonic()
    r = httpx.post(f"{svc.url}/score", json={"items": [{"prompt": "p", "response": "r"}]}, timeout=60)
    assert r.status_code == 200, r.text
    error = r.json()["errors"][0]["error"]
    assert "item 0: compute_score result is nan, not a finite number" in error, error
    assert "after 3 tries" not in error, error
    assert time.monotonic() - t0 < 1.5  # no backoff waited (0.5 s, then 1 s)
    text = httpx.get(f"{svc.url}/metrics", timeout=10).text
    assert metric_value(text, "fleetrl_reward_scorer_retries_total", scorer="nan") == 0


def _sleeper(sleep_s: float) -> ScoreItem:
    return ScoreItem(prompt="p", response="r", metadata={"extra_info": {"sleep_s": sleep_s}})


@pytest.mark.process
async def test_a_call_past_its_timeout_frees_its_worker():
    """One worker; a call that would block for 10 minutes is cancelled at its timeout: its process is killed
    and replaced, so the next call is answered (a thread would have stayed blocked, and so would the scorer)."""
    metrics = RewardMetrics()
    scorer = PythonScorer(PythonScorerConfig(name="stuck", function="tests.reward.plugins:verl_blocking",
                                             signature="verl", max_workers=1), metrics)
    await scorer.start()
    try:
        for _ in range(2):  # twice: the replacement can be killed and replaced as well
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(scorer.score([_sleeper(600.0)]), 1.0)
            start = time.monotonic()
            assert await asyncio.wait_for(scorer.score([_sleeper(0.0)] * 3), 60.0) == [0.5] * 3
            assert time.monotonic() - start < 30.0
        assert metrics.python_workers_replaced.labels("stuck")._value.get() == 2
        await scorer.check()
    finally:
        await scorer.close()


@pytest.mark.process
async def test_a_worker_that_dies_fails_its_call_and_is_replaced():
    scorer = PythonScorer(PythonScorerConfig(name="dies", function="tests.reward.plugins:verl_dies", signature="verl",
                                             max_workers=1), RewardMetrics())
    await scorer.start()
    try:
        for _ in range(2):
            with pytest.raises(ScorerFailure, match="died during the call .exit code 3"):
                await asyncio.wait_for(scorer.score([_sleeper(0.0)]), 60.0)
    finally:
        await scorer.close()


async def test_thread_isolation_reports_threads_held_past_the_timeout():
    """isolation: thread cannot stop a stuck call; once every thread is held past timeout_s, /health says so."""
    scorer = PythonScorer(PythonScorerConfig(name="t", function="tests.reward.plugins:verl_blocking", signature="verl",
                                             max_workers=1, timeout_s=0.2, isolation="thread"), RewardMetrics())
    await scorer.start()
    call = asyncio.ensure_future(scorer.score([_sleeper(1.5)]))
    await asyncio.sleep(0.6)
    with pytest.raises(ScorerUnavailable, match="1 threads are held by calls past timeout_s"):
        await scorer.check()
    assert await call == [0.5]
    await scorer.check()
    await scorer.close()
