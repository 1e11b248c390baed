"""A run knows what it was started with (the spec recorded in run_dir): a changed spec continues only when
budgets grew, else it is refused in one line naming what changed and the ways out; one fleetrl run per run dir."""

from __future__ import annotations

import os

import pytest

from deploy.run.run_record import (
    RunLock,
    RunLocked,
    compare,
    fingerprint,
    latest_step,
    read_record,
    write_record,
)

OLD = {"run_name": "add", "model": "/m/tiny", "optim": {"actor_lr": 1e-5}, "train": {"max_steps": 30, "seed": 1},
       "data": {"path": "/d/train.parquet", "epochs": 1}, "eval": {"every": 5}, "replicas": {"rollout": 1}}


def changed(**edits) -> dict:
    new = {k: dict(v) if isinstance(v, dict) else v for k, v in OLD.items()}
    for dotted, value in edits.items():
        section, _, key = dotted.partition("__")
        if key:
            new[section][key] = value
        else:
            new[section] = value
    return new


def test_the_same_spec_continues_silently_and_its_fingerprint_ignores_key_order():
    assert compare(OLD, changed(), "run.yaml").ok and compare(OLD, changed(), "run.yaml").notes == ()
    assert fingerprint(OLD) == fingerprint(dict(reversed(list(OLD.items()))))
    assert fingerprint(OLD) != fingerprint(changed(train__max_steps=60))


def test_grown_budgets_continue_and_say_so():
    v = compare(OLD, changed(train__max_steps=60, data__epochs=3), "run.yaml")
    assert v.ok and v.problem is None
    assert "spec changed since the last start: train.max_steps grew 30 -> 60: the run continues to the new budget" \
        in v.notes
    assert any(n.startswith("spec changed since the last start: data.epochs grew 1 -> 3") for n in v.notes)
    assert compare(OLD, changed(eval__every=10, replicas__rollout=2), "run.yaml").ok  # watching, not training


def test_a_changed_model_or_lr_is_refused_in_one_line_with_both_ways_out():
    v = compare(OLD, changed(model="/m/sft-export", optim__actor_lr=5e-4), "run.yaml")
    assert not v.ok and "\n" not in v.problem
    assert v.problem.startswith("run.yaml changed since this run was started: model /m/tiny -> /m/sft-export; "
                                "optim.actor_lr 1e-05 -> 0.0005.")
    assert "fleetrl run run.yaml --reset" in v.problem and "new run_name" in v.problem


def test_a_shrunk_budget_is_refused():
    v = compare(OLD, changed(train__max_steps=10), "run.yaml")
    assert not v.ok and "train.max_steps 30 -> 10 (a budget may only grow)" in v.problem


def test_the_record_round_trips_and_a_missing_one_is_none(tmp_path):
    assert read_record(tmp_path) is None
    write_record(tmp_path, OLD)
    assert read_record(tmp_path) == OLD


def test_latest_step_is_the_newest_complete_checkpoint(tmp_path):
    assert latest_step(tmp_path / "none") is None
    for step, complete in ((10, True), (20, True), (30, False)):
        d = tmp_path / f"step-{step:08d}"
        d.mkdir()
        if complete:
            (d / "COMPLETE").write_text("")
    assert latest_step(tmp_path) == 20


def test_a_second_holder_of_the_run_dir_is_refused_naming_the_first_pid(tmp_path):
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire("fleetrl run a.yaml")
    with pytest.raises(RunLocked, match=rf"in use by another fleetrl run \(PID {os.getpid()}\)"):
        second.acquire("fleetrl run a.yaml")
    first.release()
    second.acquire("fleetrl run a.yaml")  # free again once the first has let go
    second.release()


def test_a_changed_list_item_is_named_by_its_index_as_set_names_it():
    """A changed URL of a reward scorer was shown as the whole list cut to 60 characters, the same on both sides
    (`reward.scorers [{"name": "myrm", "weight": 1.0, "on_error": "fail", "tim... -> [{"name": "myrm", ...`)."""
    scorer = {"name": "myrm", "weight": 1.0, "on_error": "fail", "timeout_s": 10.0, "kind": "http",
              "url": "http://127.0.0.1:5099/get_reward"}
    old = {**OLD, "reward": {"scorers": [scorer]}}
    new = {**OLD, "reward": {"scorers": [{**scorer, "url": "http://127.0.0.1:5098/get_reward"},
                                         {"name": "fmt", "kind": "rule"}]}}
    verdict = compare(old, new, "fleetrl.yaml")
    assert not verdict.ok
    assert verdict.problem.startswith(
        "fleetrl.yaml changed since this run was started: reward.scorers.0.url http://127.0.0.1:5099/get_reward -> "
        'http://127.0.0.1:5098/get_reward; reward.scorers.1 (not set) -> {"name": "fmt", "kind": "rule"}. A run '
        "continues only")
    # another kind of scorer in its place: the item whole, not each field the kinds do not share
    other = compare(old, {**OLD, "reward": {"scorers": [{"name": "exact", "kind": "rule", "weight": 1.0}]}}, "f")
    assert other.problem.startswith('f changed since this run was started: reward.scorers.0 {"name": "myrm", '), \
        other.problem
    assert '-> {"name": "exact", "kind": "rule", "weight": 1.0}. A run' in other.problem
    assert compare(old, {**OLD, "reward": {"scorers": [dict(reversed(scorer.items()))]}}, "f").problem is None
