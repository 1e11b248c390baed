"""make compose-test's checks after the scale 1 -> 3 -> 1: compose durations, a replica's drain line, and the
learner's history read for positions trained twice or short."""

from __future__ import annotations

import json
import logging

import pytest

from deploy.compose.elastic_checks import drained_line, grace_seconds, trained_positions


@pytest.mark.parametrize(("value", "seconds"), [("60s", 60), ("1m30s", 90), ("500ms", 0.5), ("2m", 120), (45, 45),
                                                ("30", 30), (None, 10)])
def test_compose_durations(value, seconds):
    assert grace_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["sixty", "60x", "1m 30s", ""])
def test_a_duration_compose_would_refuse_is_refused(value):
    with pytest.raises(ValueError, match="compose duration"):
        grace_seconds(value)


def test_the_drain_line_the_worker_logs_is_read(caplog):
    # the line as services/rollout/worker/loop.py logs it, through logging's own formatting
    log = logging.getLogger("services.rollout.worker.loop")
    with caplog.at_level(logging.INFO):
        log.info("rollout worker %s drained: %d group(s) held, %d finished, %d handed back, %.1fs", "abc-1", 4, 3, 1,
                 2.04)
    text = "noise\n" + caplog.text
    d = drained_line(text)
    assert (d.consumer, d.held, d.finished, d.handed_back, d.seconds) == ("abc-1", 4, 3, 1, 2.0)
    assert drained_line("rollout worker abc-1 started (run demo, concurrency 32)") is None


def _metrics(path, steps, stale=None):
    path.write_text("".join(json.dumps({"step": s, "sample_ids": ids, "prompts_abandoned": 0,
                                        "experiences_deduplicated": 2,
                                        "experiences_dropped_stale": (stale or {}).get(s, 0)}) + "\n"
                            for s, ids in steps))
    return path


def _group(position, n=2, attempt=0):
    return [f"{position}-r{attempt}#{i}" for i in range(n)]


def test_every_group_once_and_whole_is_ok(tmp_path):
    t = trained_positions(_metrics(tmp_path / "m.jsonl", [(1, _group("e0-0") + _group("e0-1")),
                                                          (2, _group("e0-2") + _group("e1-0"))]), group_size=2)
    assert t.ok and (t.steps, t.groups, t.samples) == (2, 4, 8)
    assert t.counters == {"prompts_abandoned": 0, "experiences_deduplicated": 2, "experiences_dropped_stale": 0}
    assert t.rose_at == {"experiences_deduplicated": [1]}


def test_the_steps_at_which_work_was_thrown_away_are_named(tmp_path):
    steps = [(s, _group(f"e0-{s}")) for s in range(1, 6)]
    t = trained_positions(_metrics(tmp_path / "m.jsonl", steps, stale={1: 0, 2: 8, 3: 8, 4: 16, 5: 16}), group_size=2)
    assert t.rose_at["experiences_dropped_stale"] == [2, 4]


def test_a_position_trained_in_two_groups_or_a_sample_twice_is_found(tmp_path):
    t = trained_positions(_metrics(tmp_path / "m.jsonl", [(1, _group("e0-0") + _group("e0-1")),
                                                          (2, _group("e0-0", attempt=1) + _group("e0-1"))]),
                          group_size=2)
    assert not t.ok and t.twice == ["e0-0", "e0-1"]


def test_a_short_group_is_found_and_a_replayed_step_counts_once(tmp_path):
    t = trained_positions(_metrics(tmp_path / "m.jsonl", [(1, _group("e0-0")), (1, _group("e0-0")),
                                                          (2, _group("e0-1", n=1))]), group_size=2)
    assert t.twice == [] and t.short == ["e0-1"] and t.steps == 2


def test_a_history_without_sample_ids_is_an_error_not_a_pass(tmp_path):
    (tmp_path / "m.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    with pytest.raises(ValueError, match="log_sample_ids"):
        trained_positions(tmp_path / "m.jsonl", group_size=2)
