"""What a user sees of their own reward server from ``fleetrl run`` / ``fleetrl eval``: a wrong URL refused before
anything starts (one line with the scorer and the URL, within 10 s), a scorer failing mid-run said as
``stalled: ...`` after ``reward.stall_after_s`` and the run stopped after ``reward.give_up_after_s``, reward
errors in the user's terms (never the reward service's own port, a dict repr or a web link), held-out accuracy
against ``eval.success_threshold`` with the mean reward beside it, and hints that repeat the command run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from deploy.local.evaluate import RewardUnavailable, score
from deploy.run.cli import command_line
from deploy.run.heldout import next_eval_step
from deploy.run.load import load_spec
from deploy.run.preflight import remote_problems
from deploy.run.progress import EvalPoint, Poller, RunView
from deploy.run.reward_stall import RewardStall, before_after
from deploy.run.run_record import compare
from deploy.run.spec import RewardSpec
from shared.ports import free_port
from tests.deploy.run.conftest import tiny_spec, with_remote_scorer
from tests.procs import REPO


def test_remote_problems_name_the_scorer_and_url_and_how_to_skip(tmp_path, tiny_model_dir):
    dead = f"http://127.0.0.1:{free_port()}/get_reward"
    spec = load_spec(with_remote_scorer(tiny_spec(tmp_path, tiny_model_dir), dead))
    assert remote_problems(spec) == [(f"reward scorer 'myrm' at {dead}: cannot connect (Connection refused) "
                                      "(fleetrl run --skip-preflight skips this check)")]
    spec = load_spec(tiny_spec(tmp_path, tiny_model_dir))  # a rule scorer: nothing remote to probe
    assert remote_problems(spec) == []
    raw = yaml.safe_load((tmp_path / "run.yaml").read_text())
    raw["reward"] = {"url": f"http://127.0.0.1:{free_port()}"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
    (line,) = remote_problems(load_spec(tmp_path / "run.yaml"))
    assert line.startswith(f"reward.url {raw['reward']['url']}: cannot connect")


@pytest.mark.process
def test_fleetrl_run_refuses_a_wrong_reward_url_within_10_s_and_eval_too(tmp_path, tiny_model_dir):
    dead = f"http://127.0.0.1:{free_port()}/get_reward"
    spec = with_remote_scorer(tiny_spec(tmp_path, tiny_model_dir), dead)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for verb in ("run", "eval"):
        start = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "deploy.cli", verb, str(spec), "--set", "run_name=mine"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
        took = time.monotonic() - start
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert f"error: reward scorer 'myrm' at {dead}: cannot connect (Connection refused)" in text, text
        assert "Traceback" not in text and "127.0.0.1:1/" not in text
        if verb == "run":
            assert took < 10, (took, text)
            assert "starting reward-0" not in text and "starting learner" not in text  # nothing started


def test_a_reward_service_error_is_the_scorer_and_url_never_its_own_port_or_a_web_link():
    detail = ("reward scorer 'myrm' at http://127.0.0.1:5099/get_reward failed after 3 tries: cannot connect "
              "(Connection refused)")

    def reward_service(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": detail, "type": "scorer_unavailable",
                                         "errors": [{"scorer": "myrm", "error": detail}]})

    with httpx.Client(transport=httpx.MockTransport(reward_service)) as client, pytest.raises(RewardUnavailable) as failed:
        score(client, "http://127.0.0.1:58747", [{"prompt": "p", "response": "r"}])
    assert str(failed.value) == detail
    assert "58747" not in str(failed.value) and "developer.mozilla" not in str(failed.value)

    def gone(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with httpx.Client(transport=httpx.MockTransport(gone)) as client, pytest.raises(RewardUnavailable) as failed:
        score(client, "http://127.0.0.1:58747", [{"prompt": "p", "response": "r"}])
    assert "58747" not in str(failed.value)


def test_a_failing_scorer_stalls_the_run_after_stall_after_s_and_stops_it_after_give_up_after_s():
    stall = RewardStall(RewardSpec(url="http://x", stall_after_s=60, give_up_after_s=600))
    where = "reward scorer 'myrm' at http://127.0.0.1:5099/get_reward"
    assert stall.check({}) == (None, False)
    assert stall.check({where: (59.0, "cannot connect (Connection refused)")}) == (None, False)
    line, give_up = stall.check({where: (61.2, "cannot connect (Connection refused)"), "reward scorer 'b' (rule)":
                                 (1.0, "x")})
    assert line == f"stalled: {where} failing for 61 s (last error: cannot connect (Connection refused))"
    assert not give_up
    assert stall.check({where: (600.0, "answered 503")})[1]
    # a server that answers, with garbage, is not "unreachable" (the line said so for a NaN reward)
    nan = "remote rewards[0] is nan, not a finite number"
    assert stall.check({where: (61.0, nan)})[0] == f"stalled: {where} failing for 61 s (last error: {nan})"
    never = RewardStall(RewardSpec(url="http://x", give_up_after_s=0))
    assert never.check({where: (86_400.0, "answered 503")})[1] is False
    assert RewardSpec(url="http://x").stall_after_s == 60 and RewardSpec(url="http://x").give_up_after_s == 600


def test_the_poller_reads_failing_scorers_and_shows_them_without_a_dict_repr():
    where = "reward scorer 'myrm' at http://127.0.0.1:5099/get_reward"

    def reward_health(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"status": "unhealthy", "scorers": {"myrm": "circuit open (last error: "
                                                                           "cannot connect (Connection refused))"},
                                         "failing": {"myrm": {"where": where, "for_s": 75.0,
                                                              "error": "cannot connect (Connection refused)"}}})

    poller = Poller(fleet=None, run_name="r")  # type: ignore[arg-type]
    poller._client = httpx.Client(transport=httpx.MockTransport(reward_health))
    view = poller._reward("reward-0", "http://127.0.0.1:1")
    assert view.doing == f"{where}: circuit open (last error: cannot connect (Connection refused))"
    assert "{" not in view.doing
    assert poller.view.reward_failing == {where: (75.0, "cannot connect (Connection refused)")}

    def no_answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    # a reward service that does not answer one poll (busy, a slow health check) has not cleared its scorers:
    # what it said last stands, so the run neither says the scorer is back nor forgets how long it has failed
    poller.view.reward_failing = {}
    poller._failing_before = {where: (75.0, "cannot connect (Connection refused)")}
    poller._client = httpx.Client(transport=httpx.MockTransport(no_answer))
    assert poller._reward("reward-0", "http://127.0.0.1:1").state == "starting"
    assert poller.view.reward_failing == {where: (75.0, "cannot connect (Connection refused)")}


def test_held_out_results_say_accuracy_and_mean_reward_before_and_after():
    evals = [EvalPoint(0, 0.16, "0", 0.412), EvalPoint(100, 0.31, "100", 0.655), EvalPoint(200, 0.335, "200", 0.7)]
    assert before_after(evals, 127.4) == \
        "held-out accuracy: 16.0% -> 33.5% (mean reward 0.412 -> 0.700), 200 steps, 127 s"
    assert before_after([EvalPoint(0, 0.0, "0"), EvalPoint(5, 0.5, "5")], 3) == \
        "held-out accuracy: 0.0% -> 50.0%, 5 steps, 3 s"
    assert RunView("r").stalled is None


def test_a_resumed_run_evaluates_on_the_multiples_of_eval_every():
    assert [next_eval_step(s, 25) for s in (0, 24, 25, 63, 64, 75)] == [25, 25, 50, 75, 75, 100]


def test_hints_repeat_the_command_the_user_ran_with_its_sets():
    cmd = command_line("run", Path("examples/x/fleetrl.yaml"), ["run_name=mine", "train.max_steps=5"])
    assert cmd == "fleetrl run examples/x/fleetrl.yaml --set run_name=mine --set train.max_steps=5"
    old = {"algorithm": {"name": "grpo"}}
    verdict = compare(old, {"algorithm": {"name": "ppo"}}, "examples/x/fleetrl.yaml", cmd)
    assert f"start it over with {cmd} --reset" in verdict.problem
    # a resumed run recorded before these settings existed is not refused over them
    assert compare({"reward": {"url": "u"}}, {"reward": {"url": "u", "stall_after_s": 60.0,
                                                         "give_up_after_s": 600.0}}, "f").ok


class Events:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, msg: str) -> None:
        self.lines.append(msg)


def test_the_launcher_says_stalled_once_and_gives_up_naming_the_command(tmp_path, tiny_model_dir):
    from deploy.run.launch import RunError, RunLauncher

    spec_file = tiny_spec(tmp_path, tiny_model_dir)
    spec = load_spec(spec_file, ["reward.stall_after_s=5", "reward.give_up_after_s=30", "run_name=mine"])
    display = Events()
    launcher = RunLauncher(spec, spec_file, display, command=command_line("run", spec_file, ["run_name=mine"]))
    where = "reward scorer 'myrm' at http://127.0.0.1:5099/get_reward"
    view = RunView("mine")
    for seconds in (1.0, 6.0, 7.0):
        view.reward_failing = {where: (seconds, "cannot connect (Connection refused)")}
        launcher._reward_stalled(view)
    assert display.lines == [f"stalled: {where} failing for 6 s (last error: cannot connect (Connection refused))"]
    assert view.stalled.endswith("failing for 7 s (last error: cannot connect (Connection refused))")
    view.reward_failing = {}
    launcher._reward_stalled(view)
    assert view.stalled is None  # it came back, and the run says so once
    assert display.lines[1:] == [f"back: {where} answers again after 7 s or more of failing; the run goes on"]
    launcher._reward_stalled(view)
    assert len(display.lines) == 2
    view.reward_failing = {where: (31.0, "answered 503: busy")}
    with pytest.raises(RunError) as gave_up:
        launcher._reward_stalled(view)
    assert str(gave_up.value) == (
        f"stalled: {where} failing for 31 s (last error: answered 503: busy); gave up after "
        f"reward.give_up_after_s = 30 s (the learner checkpoints; fix the scorer and run fleetrl run {spec_file} "
        "--set run_name=mine to resume)")
