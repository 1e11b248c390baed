"""The run-wide settings (shared/run_settings.py): one section every service embeds, its former places still read,
and the run's record in Redis that a later service must agree with (a real Redis)."""

from __future__ import annotations

import json

import pytest
import redis
from pydantic import SecretStr

from services.learner.settings import LearnerSettings
from services.rollout.settings import RolloutSettings
from shared import keys
from shared.run_settings import RunSettings, check_run_record, move_legacy, run_record_problem
from shared.settings import SettingsError, load_settings

KEY = SecretStr("k" * 32)


@pytest.fixture()
def client(redis_server):
    c = redis.Redis.from_url(redis_server.url, socket_timeout=10, socket_connect_timeout=5)
    c.flushall()
    yield c
    c.close()


def test_the_first_service_writes_the_record_and_an_agreeing_one_joins(client):
    run = RunSettings(max_staleness=2, prompt_claim_idle_ms=5000)
    assert run_record_problem(client, "r1", run, KEY, "learner") is None
    record = json.loads(client.get(keys.run_settings("r1")))
    assert record["settings"] == {"max_staleness": 2, "prompt_claim_idle_ms": 5000, "max_experience_backlog": 4096}
    assert record["written_by"] == "learner" and record["run_key"] and "k" * 16 not in record["run_key"]
    for _ in range(2):  # any number of agreeing services, the record unchanged
        assert run_record_problem(client, "r1", RunSettings(max_staleness=2, prompt_claim_idle_ms=5000), KEY,
                                  "rollout") is None
    assert json.loads(client.get(keys.run_settings("r1")))["written_by"] == "learner"


def test_a_later_service_with_another_value_is_refused_in_one_line_naming_the_field(client):
    assert run_record_problem(client, "r2", RunSettings(max_staleness=2), KEY, "learner") is None
    problem = run_record_problem(client, "r2", RunSettings(max_staleness=4), KEY, "rollout")
    assert problem is not None and "\n" not in problem
    assert problem.startswith("run 'r2': run.max_staleness is 4 here but 2 in the run's record (written by learner at ")
    assert "start every service of a run with the same values" in problem
    assert f"redis-cli DEL {keys.run_settings('r2')}" in problem
    both = run_record_problem(client, "r2", RunSettings(max_staleness=4, max_experience_backlog=7), KEY, "rollout")
    assert "run.max_staleness is 4 here but 2" in both and "run.max_experience_backlog is 7 here but 4096" in both
    # another run's record is another run's
    assert run_record_problem(client, "r3", RunSettings(max_staleness=4), KEY, "rollout") is None


def test_another_run_key_or_none_is_refused_without_showing_a_key(client):
    assert run_record_problem(client, "rk", RunSettings(), KEY, "learner") is None
    other = run_record_problem(client, "rk", RunSettings(), SecretStr("o" * 32), "rollout")
    assert other is not None and "run_key here is not the key the run's record was written with" in other
    assert "k" * 16 not in other and "o" * 16 not in other
    unset = run_record_problem(client, "rk", RunSettings(), None, "rollout")
    assert unset is not None and "run_key is unset here" in unset
    assert run_record_problem(client, "unsigned", RunSettings(), None, "learner") is None
    signed = run_record_problem(client, "unsigned", RunSettings(), KEY, "rollout")
    assert signed is not None and "written without one" in signed


def test_a_record_that_is_not_ours_is_named(client):
    client.set(keys.run_settings("junk"), b"\x00not json")
    problem = run_record_problem(client, "junk", RunSettings(), KEY, "rollout")
    assert problem is not None and "is not a FleetRL run record" in problem


def test_check_run_record_opens_its_own_client(redis_server, client):
    assert check_run_record(redis_server.url, "url", RunSettings(), None, "rollout") is None
    assert "run.max_staleness is 0 here but 1" in check_run_record(redis_server.url, "url",
                                                                   RunSettings(max_staleness=0), None, "learner")


def test_the_former_places_are_read_into_the_run_section_and_two_values_are_refused(monkeypatch, tmp_path):
    said: list[str] = []
    moved = move_legacy("rollout", {"worker": {"max_staleness": 3, "claim_idle_ms": 900, "concurrency": 2},
                                    "sessions": {"max_experience_backlog": 9}}, said.append)
    assert moved == {"worker": {"concurrency": 2}, "sessions": {},
                     "run": {"max_staleness": 3, "prompt_claim_idle_ms": 900, "max_experience_backlog": 9}}
    assert "worker.claim_idle_ms is now run.prompt_claim_idle_ms (the run-wide section every service of a run " \
           "shares): rename it" in said
    with pytest.raises(ValueError, match=r"worker.max_experience_backlog \(1\) and sessions.max_experience_backlog "
                                         r"\(2\) are one run-wide setting now, run.max_experience_backlog"):
        move_legacy("rollout", {"worker": {"max_experience_backlog": 1}, "sessions": {"max_experience_backlog": 2}})
    # through the environment, the former variable names still work
    monkeypatch.setenv("FLEETRL_ROLLOUT_WORKER__MAX_STALENESS", "3")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert load_settings(RolloutSettings, model=str(model)).run.max_staleness == 3
    monkeypatch.setenv("FLEETRL_ROLLOUT_RUN__MAX_STALENESS", "2")
    with pytest.raises(SettingsError, match=r"worker.max_staleness \(3\) and run.max_staleness \(2\) are one "
                                            r"setting: give only run.max_staleness"):
        load_settings(RolloutSettings, model=str(model))
    learner = LearnerSettings(model={"actor": str(model)}, data={"path": "d.jsonl"}, rollout={"max_staleness": 5})
    assert learner.run.max_staleness == 5


@pytest.mark.process
def test_a_rollout_replica_that_disagrees_with_the_run_exits_2_in_one_line(redis_server, client, tmp_path):
    """The rollout's entry point checks the record before it loads anything (no model is loaded here)."""

    import yaml

    from tests.procs import one_error_line, run_module

    run = "record-proc"  # a name of its own: the record stays in this Redis after the test
    assert run_record_problem(client, run, RunSettings(max_staleness=2), KEY, "learner") is None
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = tmp_path / "rollout.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": str(model), "redis_url": redis_server.url, "run_name": run, "run_key": KEY.get_secret_value(),
        "worker": {"enabled": True, "reward_url": "http://127.0.0.1:9", "max_staleness": 4}}))
    out = run_module(["-m", "services.rollout", "--config", str(cfg)], timeout=120)
    assert one_error_line(out).startswith(f"error: run '{run}': run.max_staleness is 4 here but 2 in the run's record "
                                "(written by learner at ")


def test_a_run_section_given_as_a_model_keeps_only_what_it_was_given():
    moved = move_legacy("learner", {"rollout": {"max_staleness": 3}, "run": RunSettings(max_experience_backlog=8)})
    assert moved["run"] == {"max_experience_backlog": 8, "max_staleness": 3}
    with pytest.raises(ValueError, match="run: a mapping of run-wide settings, not int"):
        move_legacy("learner", {"rollout": {"max_staleness": 3}, "run": 5})
