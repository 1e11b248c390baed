"""Completions you can see: every ``observability.log_every`` steps (and at step 1) a few trained samples, one per
prompt group first, go to samples.jsonl with prompt, completion, reward and length; ``log_samples`` still logs
every sample every step."""

from __future__ import annotations

import json
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from services.learner.observability import MetricsSink, pick_samples, samples_markdown
from services.learner.settings import ObservabilitySettings


def sample(group: str, k: int, reward: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(id=f"{group}-{k}", group_id=group, label="0123", prompt_text=f"sort {group}=",
                           response_text="0123" + "x" * k, reward=reward, reward_components={"exact": reward},
                           weight_version=3, finish_reason="length" if k else "stop", response_token_ids=[1] * (4 + k),
                           created_at=1.0, generated_at=2.0)


BATCH = [sample(g, k) for g in ("a", "b", "c") for k in range(2)]


def lines(sink: MetricsSink) -> list[dict]:
    return [json.loads(x) for x in sink.samples_path.read_text().splitlines()] if sink.samples_path.exists() else []


def test_a_few_samples_every_log_every_steps(tmp_path):
    sink = MetricsSink(ObservabilitySettings(log_every=5, samples_per_log=2), tmp_path, CollectorRegistry())
    for step in range(1, 11):
        sink.log_samples(step, BATCH)
    rows = lines(sink)
    assert [r["step"] for r in rows] == [1, 1, 5, 5, 10, 10]
    assert [r["group_id"] for r in rows[:2]] == ["a", "b"]  # different prompts first
    assert rows[0] | {"created_at": 0} == {
        "step": 1, "id": "a-0", "group_id": "a", "label": "0123", "prompt_text": "sort a=", "response_text": "0123",
        "reward": 1.0, "reward_components": {"exact": 1.0}, "weight_version": 3, "finish_reason": "stop",
        "response_tokens": 4, "created_at": 0, "generated_at": 2.0}


def test_log_samples_still_logs_everything_and_log_every_null_nothing(tmp_path):
    every = MetricsSink(ObservabilitySettings(log_samples=True), tmp_path / "all", CollectorRegistry())
    every.log_samples(2, BATCH)
    assert len(lines(every)) == 6
    off = MetricsSink(ObservabilitySettings(log_every=None), tmp_path / "off", CollectorRegistry())
    off.log_samples(1, BATCH)
    assert lines(off) == []


def test_pick_and_table():
    assert [e.id for e in pick_samples(BATCH, 4)] == ["a-0", "b-0", "c-0", "a-1"]
    table = samples_markdown([{"prompt_text": "a|b", "response_text": "x\ny", "reward": 0.5, "response_tokens": 3,
                               "finish_reason": "stop"}])
    assert table.splitlines()[2] == "| a\\|b | x\\ny | 0.5 | 3 | stop |"
