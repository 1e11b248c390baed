"""The run spec: strict like the service settings, --set overrides validated the same way, every service's
settings derived from it (shared values written once), a service's own setting that contradicts it refused
with both places named."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from deploy.run.derive import leaves
from deploy.run.load import SpecError, load_spec
from deploy.run.plan import plan
from shared.settings import SettingsError
from tests.procs import REPO


def by_name(procs):
    return {p.name: p.config for p in procs}


def test_shared_values_are_written_once_and_reach_every_service(spec_file):
    spec = load_spec(spec_file, ["staleness=2", "sampling.temperature=0.7", "replicas.rollout=2"])
    cfg = by_name(plan(spec, spec_file, "redis://127.0.0.1:1/0", "tok"))
    assert set(cfg) == {"reward-0", "rollout-0", "rollout-1", "learner"}
    learner, rollouts = cfg["learner"], [cfg["rollout-0"], cfg["rollout-1"]]
    assert learner["run"]["max_staleness"] == 2 and all(r["run"]["max_staleness"] == 2 for r in rollouts)
    assert learner["rollout"]["sampling"]["temperature"] == 0.7
    assert all(r["worker"]["sampling"]["temperature"] == 0.7 for r in rollouts)
    assert learner["rollout"]["group_size"] == 2 and learner["rollout"]["window"] == 4  # 2 x groups_per_step
    assert {learner["run_name"], *(r["run_name"] for r in rollouts)} == {"tiny"}
    assert {learner["redis_url"], *(r["redis_url"] for r in rollouts)} == {"redis://127.0.0.1:1/0"}
    assert {r["worker"]["reward_url"] for r in rollouts} == {f"http://127.0.0.1:{cfg['reward-0']['port']}"}
    assert learner["model"]["actor"] == rollouts[0]["model"]
    assert learner["data"]["path"] == str(spec_file.parent / "train.jsonl")  # relative to the spec file
    assert learner["model"]["device"] == "cpu"  # the learner's own part, from services.learner
    assert len({r["worker"]["consumer_name"] for r in rollouts}) == 2


@pytest.mark.parametrize(("sets", "message"), [
    (["train.max_stepz=3"], "--set train.max_stepz: unknown setting train.max_stepz (did you mean train.max_steps?)"),
    (["algorithm.kl.coeff=0"], "unknown setting algorithm.kl.coeff (did you mean algorithm.kl.coef?)"),
    (["sampling.temperature=-1"], "--set sampling.temperature: sampling.temperature: Input should be greater"),
    (["reward.url=http://x"], "--set reward.url: reward: set exactly one of reward.scorers"),
    (["train"], "--set 'train': write it as key.path=value"),
    (["eval.data=null", "eval.every=5"], "eval.every needs eval.data"),
])
def test_bad_overrides_are_one_line_naming_the_setting(spec_file, sets, message):
    with pytest.raises(SpecError) as err:
        load_spec(spec_file, sets)
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_a_set_reaches_an_item_of_a_list_by_its_index_and_never_prints_the_list(spec_file):
    """``--set reward.scorers.0.url=...`` (a walk of docs/your-own-task.md tried it: it was refused with the whole
    list printed, a scorer's api_key included)."""
    raw = yaml.safe_load(spec_file.read_text())
    raw["reward"] = {"scorers": [{"name": "myrm", "kind": "http", "protocol": "openrlhf",
                                  "url": "http://127.0.0.1:5099/get_reward", "api_key": "sk-secret"}]}
    spec_file.write_text(yaml.safe_dump(raw))
    spec = load_spec(spec_file, ["reward.scorers.0.url=http://127.0.0.1:5099/get_rewards", "reward.scorers.0.timeout_s=5"])
    (scorer,) = spec.reward.scorers
    assert (scorer.url, scorer.timeout_s) == ("http://127.0.0.1:5099/get_rewards", 5)
    for sets, message in (
            (["reward.scorers.1.url=x"], ("--set reward.scorers.1.url: reward.scorers is a list of 1: name an item "
                                          "by its index (0)")),
            (["reward.scorers.myrm.url=x"], ("--set reward.scorers.myrm.url: reward.scorers is a list of 1: name an "
                                             "item by its index (0)")),
            (["run_name.x=1"], "--set run_name.x: run_name is a str, not a section")):
        with pytest.raises(SpecError) as err:
            load_spec(spec_file, sets)
        assert str(err.value) == message and "sk-secret" not in str(err.value)


def test_an_unknown_key_in_the_file_names_the_file(spec_file):
    raw = yaml.safe_load(spec_file.read_text())
    raw["sampling"]["temprature"] = 0.5
    spec_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match=f"{spec_file}: unknown setting sampling.temprature "
                                        r"\(did you mean sampling.temperature\?\)"):
        load_spec(spec_file)


def test_a_service_setting_that_contradicts_the_spec_names_both_places(spec_file, tmp_path):
    own = tmp_path / "learner-own.yaml"
    own.write_text(yaml.safe_dump({"rollout": {"max_staleness": 3}, "optim": {"weight_decay": 0.01}}))
    spec = load_spec(spec_file, [f"services.learner={own}"])
    with pytest.raises(SettingsError) as err:
        plan(spec, spec_file, "redis://127.0.0.1:1/0", "tok")
    # the former place of the setting (rollout.max_staleness) is read as its run-wide one
    assert str(err.value) == (f"{own}: learner setting run.max_staleness = 3 contradicts the run spec's "
                              f"staleness = 1 ({spec_file}); set it in one place")
    agreeing = load_spec(spec_file, ["services.learner={rollout: {max_staleness: 1}, optim: {weight_decay: 0.01}}"])
    cfg = by_name(plan(agreeing, spec_file, "redis://127.0.0.1:1/0", "tok"))  # the same value: fine
    assert cfg["learner"]["optim"]["weight_decay"] == 0.01
    owned = load_spec(spec_file, ["services.rollout.redis_url=redis://elsewhere:1"])
    with pytest.raises(SettingsError, match="rollout setting redis_url is set by fleetrl run itself"):
        plan(owned, spec_file, "redis://127.0.0.1:1/0", "tok")


def test_a_run_wide_setting_one_service_gives_reaches_every_service_and_two_values_are_refused(spec_file):
    """Every service of a run must hold the same run-wide settings (else the later ones refuse to start): one
    given in a service's own settings, at its former place too, is written to every service's config."""
    spec = load_spec(spec_file, ["services.rollout={worker: {claim_idle_ms: 5000}}", "replicas.rollout=2"])
    cfg = by_name(plan(spec, spec_file, "redis://127.0.0.1:1/0", "tok"))
    assert {c["run"]["prompt_claim_idle_ms"] for c in (cfg["learner"], cfg["rollout-0"], cfg["rollout-1"])} == {5000}
    assert "claim_idle_ms" not in cfg["rollout-0"]["worker"]
    two = load_spec(spec_file, ["services.rollout={run: {max_experience_backlog: 10}}",
                                "services.learner={run: {max_experience_backlog: 20}}"])
    with pytest.raises(SettingsError, match=r"^services\.learner sets run\.max_experience_backlog = 20 but "
                                            r"services\.rollout sets 10: every service of a run holds the same"):
        plan(two, spec_file, "redis://127.0.0.1:1/0", "tok")


def test_a_service_setting_its_own_class_refuses_is_named(spec_file):
    spec = load_spec(spec_file, ["services.rollout.engine.max_batch=3"])
    # named by the spec's own path, where the user wrote it (issue 41), not by the service's
    with pytest.raises(SettingsError, match=r"^services\.rollout\.engine\.max_batch: unknown setting"):
        plan(spec, spec_file, "redis://127.0.0.1:1/0", "tok")
    typo = load_spec(spec_file, ["services.rollout.engin={kind: hf}"])
    with pytest.raises(SettingsError, match=r"^services\.rollout\.engin: unknown setting \(did you mean engine\?\)"):
        plan(typo, spec_file, "redis://127.0.0.1:1/0", "tok")
    missing = load_spec(spec_file, ["model=./no-such-model"])
    with pytest.raises(SettingsError, match="model .*no model directory at .*no-such-model"):  # not "no checkpoint"
        plan(missing, spec_file, "redis://127.0.0.1:1/0", "tok")


@pytest.mark.process
def test_fleetrl_settings_prints_each_process_and_run_refuses_bad_input_in_one_line(spec_file):
    out = subprocess.run([sys.executable, "-m", "deploy.cli", "settings", str(spec_file), "--service", "learner"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    learner = yaml.safe_load(out.stdout)
    assert leaves(learner)["run.max_staleness"] == 1 and learner["run_name"] == "tiny"
    bad = subprocess.run([sys.executable, "-m", "deploy.cli", "run", str(spec_file), "--set", "train.max_stepz=3"],
                         cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == ("error: --set train.max_stepz: unknown setting train.max_stepz "
                                  "(did you mean train.max_steps?)")


def test_the_run_token_guards_the_reward_services_it_starts_and_only_those(spec_file):
    """The reward services fleetrl run starts take the run's token as auth_token, and its workers send it; a
    reward service of the user's (reward.url) never receives it."""
    cfg = by_name(plan(load_spec(spec_file, ["replicas.rollout=2"]), spec_file, "redis://127.0.0.1:1/0", "tok"))
    assert cfg["reward-0"]["auth_token"] == "tok"
    assert [cfg[r]["worker"]["reward_token"] for r in ("rollout-0", "rollout-1")] == ["tok", "tok"]
    spec = load_spec(spec_file, ["reward.scorers=null", "reward.url=http://rm.example:8002"])
    external = by_name(plan(spec, spec_file, "redis://127.0.0.1:1/0", "tok"))
    assert "reward-0" not in external and "reward_token" not in external["rollout-0"]["worker"]


def test_a_service_refusing_a_setting_the_spec_derived_names_the_specs_setting(spec_file):
    """`sampling.group_size: 1` on a GRPO spec was refused as `learner settings: <root>: grpo compares samples
    within a group: set rollout.group_size >= 2`: a learner setting the spec's user never wrote."""
    one = load_spec(spec_file, ["sampling.group_size=1"])
    with pytest.raises(SettingsError) as err:
        plan(one, spec_file, "redis://127.0.0.1:1/0", "tok")
    assert str(err.value) == "sampling.group_size: grpo compares samples within a group: set sampling.group_size >= 2"
    narrow = load_spec(spec_file, ["window=1"])
    with pytest.raises(SettingsError) as err:
        plan(narrow, spec_file, "redis://127.0.0.1:1/0", "tok")
    assert str(err.value) == "window: window (1) must be >= train.groups_per_step (2), or a step can never fill"
