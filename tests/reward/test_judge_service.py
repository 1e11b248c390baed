"""The judge scorer in a reward-service process against the stand-in judge's process: ``/health`` answers within
1 s while 256 judge calls are in flight (judging is I/O on the event loop, never blocking it), the scores come
back right when the judge answers, and the judge's metrics are exposed."""

from __future__ import annotations

import threading
import time

import httpx

from tests.reward.conftest import metric_value


def test_health_answers_within_1s_while_256_judge_calls_are_in_flight(reward_service, judge_stub):
    httpx.post(f"{judge_stub.url}/control", json={"reset": True, "delay_s": 4.0}, timeout=10)
    svc = reward_service({"scorers": [{
        "name": "judge", "kind": "judge", "url": f"{judge_stub.url}/v1/chat/completions", "model": "stub",
        "template": "Rate it.\n<response>{response}</response>", "parser": {"type": "number", "max": 10},
        "max_concurrency": 256, "timeout_s": 30}]}, name="judge")
    batch = [{"prompt": "p", "response": "good " * (k % 4) + f"#{k}"} for k in range(256)]
    result: dict = {}

    def score() -> None:
        result["reply"] = httpx.post(f"{svc.url}/score", json={"items": batch}, timeout=60)

    scoring = threading.Thread(target=score)
    scoring.start()
    deadline = time.monotonic() + 30
    while httpx.post(f"{judge_stub.url}/control", json={}, timeout=10).json()["in_flight"] < 256:
        assert time.monotonic() < deadline, "the 256 judge calls never were in flight together"
        time.sleep(0.05)
    latencies = []
    for _ in range(5):
        t0 = time.monotonic()
        health = httpx.get(f"{svc.url}/health", timeout=5)
        latencies.append(time.monotonic() - t0)
        assert health.status_code == 200, health.text
    assert httpx.post(f"{judge_stub.url}/control", json={}, timeout=10).json()["in_flight"] == 256  # still waiting
    assert max(latencies) < 1.0, latencies
    scoring.join(60)
    reply = result["reply"]
    assert reply.status_code == 200, reply.text
    assert reply.json()["scores"] == [float(k % 4) for k in range(256)]
    metrics = httpx.get(f"{svc.url}/metrics", timeout=10).text
    assert metric_value(metrics, "fleetrl_reward_judge_calls_total", scorer="judge", outcome="answered") == 256
    assert metric_value(metrics, "fleetrl_reward_judge_in_flight", scorer="judge") == 0
