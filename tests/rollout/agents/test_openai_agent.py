"""The ``openai_agent`` rollout function in the real worker: an agent program on the plain ``openai`` client, run
per sample by a rollout process (a real reward process, the tests' Redis), its calls recorded through a session
and pushed as the group's experiences: the ids the engine returned to the program turn by turn, the template
delta of the follow-up message between them (mask 0), the engine's logprobs, the program's reward or the reward
service's. A program that crashes, hangs (killed with what it started), makes no call, rewrites its history or prints a bad reward fails its
group with that reason (dead-lettered), and the worker goes on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from transformers import AutoTokenizer

from services.rollout.agents.openai_agent import RunFailed, reward_line, run_program
from services.rollout.agents.settings import ProgramSettings
from services.rollout.chat_tokens import ChatTokens
from services.rollout.settings import RolloutSettings
from shared import keys
from shared.codec import decode, encode
from shared.schemas import Experience, PromptTask
from tests.procs import starts_processes, stop
from tests.reward.conftest import start_reward_service
from tests.rollout.conftest import CONTROL_TOKEN, start_rollout

pytestmark = pytest.mark.process  # the worker runs agent programs as processes

RUN = "openai-agent"
PROGRAM = ["{python}", "-m", "tests.rollout.agents.openai_agent_program"]


@pytest.fixture(scope="module")
@starts_processes
def fleet(tiny_model_dir, redis_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai-agent")
    reward = start_reward_service(tmp, {"scorers": [
        {"name": "has_a", "kind": "rule", "check": {"type": "format", "pattern": "a"}}]})
    config = {
        "model": str(tiny_model_dir), "served_model_name": "tiny", "control_token": CONTROL_TOKEN,
        "redis_url": redis_server.url, "run_name": RUN, "weight_sidecar": False,
        "engine": {"kind": "hf", "device": "cpu", "max_batch_size": 16, "max_wait_ms": 2, "torch_threads": 1},
        "sessions": {"enabled": True, "max_sessions": 2},  # fewer than the tests' samples at once: runs wait their turn
        "worker": {"enabled": True, "reward_url": reward.url, "poll_interval_s": 0.1, "prompts_max_deliveries": 1,
                   "concurrency": 8, "rollout_function": "openai_agent",
                   "program": {"command": PROGRAM, "timeout_s": 60, "retries": 1, "reward_from_output": True}},
    }
    try:
        proc, url, log = start_rollout(tmp, "rollout", config)
    except Exception:
        stop(reward.proc)
        raise
    yield url, log, tmp
    stop(proc)
    stop(reward.proc)


def push(redis_url: str, *tasks: PromptTask) -> None:
    r = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        for t in tasks:
            r.xadd(keys.prompts_stream(RUN), {"p": encode(t)})
    finally:
        r.close()


def wait_for(redis_url: str, stream: str, count: int, timeout: float = 120) -> list[dict]:
    r = redis.Redis.from_url(redis_url, socket_timeout=10)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            entries = r.xrange(stream)
            if len(entries) >= count:
                return [fields for _, fields in entries]
            time.sleep(0.2)
    finally:
        r.close()
    raise AssertionError(f"{stream}: fewer than {count} entries after {timeout:g}s")


def experience_ids(redis_url: str) -> set[str]:
    r = redis.Redis.from_url(redis_url, socket_timeout=10)
    try:
        return {decode(f[b"p"], Experience).id for _, f in r.xrange(keys.experiences_stream(RUN))}
    finally:
        r.close()


def test_an_openai_client_program_becomes_the_groups_exact_trajectories(fleet, redis_server, tiny_model_dir):
    url, log, tmp = fleet
    push(redis_server.url, PromptTask(id="chat", prompt="What is 2+2?", label="4", n=2,
                                      metadata={"record_dir": str(tmp)}),
         PromptTask(id="judged", prompt="Say a.", label="a", n=2, metadata={"mode": "score"}))
    fields = wait_for(redis_server.url, keys.experiences_stream(RUN), 4)
    exps = {e.id: e for e in (decode(f[b"p"], Experience) for f in fields)}
    assert sorted(exps) == ["chat#0", "chat#1", "judged#0", "judged#1"], log.read_text()[-3000:]

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ct = ChatTokens(tok)
    for i in range(2):
        e = exps[f"chat#{i}"]
        (p0, o0, lp0), (p1, o1, lp1) = ((t["prompt_ids"], t["output_ids"], t["logprobs"])
                                        for t in json.loads((tmp / f"chat-{i}.json").read_text()))
        # what the engine answered the program, call by call, is what the learner gets; between the model's
        # turns the template's turn ending and the delta of the follow-up message, untrained
        env = ct.close_turn(o0) + ct.delta([{"role": "user", "content": "Are you sure?"}])
        assert list(e.prompt_token_ids) == p0 and p1 == p0 + o0 + env
        assert list(e.response_token_ids) == o0 + env + o1
        assert list(e.action_mask) == [1] * len(o0) + [0] * len(env) + [1] * len(o1)
        np.testing.assert_allclose(e.response_logprobs, lp0 + [0.0] * len(env) + lp1, rtol=0, atol=1e-5)
        assert e.reward == i + 0.5 and e.reward_components == {"index": i + 0.5}  # the program's reward line
        assert (e.group_id, e.group_size, e.index, e.label) == ("chat", 2, i, "4") and e.metadata["turns"] == 2
        assert e.sampling.temperature == 1.0 and e.sampling.max_tokens == 5 and e.finish_reason in ("stop", "length")
    for i in range(2):  # no reward line: the reward service judged the model's last turn
        e = exps[f"judged#{i}"]
        assert set(e.reward_components) == {"has_a"} and e.reward == e.reward_components["has_a"]
        assert 0 in e.action_mask and e.metadata["turns"] == 2
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert 'fleetrl_rollout_sessions_total{outcome="finished"} 4.0' in metrics
    assert "fleetrl_rollout_sessions_open 0.0" in metrics  # every session was closed, none left to expire


def test_a_misbehaving_program_fails_its_group_with_the_reason_and_the_worker_goes_on(fleet, redis_server):
    url, log, _ = fleet
    modes = ["crash", "no_call", "rewrite", "bad_reward"]  # a hang: test_a_program_past_its_timeout_is_killed
    push(redis_server.url, *(PromptTask(id=f"bad-{m}", prompt="Hi.", n=1, metadata={"mode": m}) for m in modes),
         PromptTask(id="after", prompt="Hi.", n=1))
    dead = wait_for(redis_server.url, keys.dead_letter_stream(keys.prompts_stream(RUN)), len(modes), timeout=150)
    errors = {decode(f[b"payload"], PromptTask).id: f[b"error"].decode() for f in dead}
    assert set(errors) == {f"bad-{m}" for m in modes}
    reason = {
        "crash": "it exited with code 3: boom: the agent broke",
        "no_call": "it made no model call",
        "rewrite": "are not one conversation",
        "bad_reward": "'reward' must be a finite number",
    }
    for m in modes:
        assert "the agent program failed 2 times" in errors[f"bad-{m}"] and reason[m] in errors[f"bad-{m}"], errors
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "after#0" not in experience_ids(redis_server.url):
        time.sleep(0.2)
    assert "after#0" in experience_ids(redis_server.url), log.read_text()[-3000:]  # the worker carried on
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert "fleetrl_rollout_sessions_open 0.0" in metrics  # the failed runs' sessions were deleted


async def test_a_program_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    """The program and its children (its process group) are killed at ``timeout_s``; the run fails saying so."""
    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    cfg = ProgramSettings(command=["{python}", "-c", script], timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(RunFailed, match=r"did not finish within 3s \(worker.program.timeout_s\); killed"):
        await run_program(cfg, {}, "")
    assert time.monotonic() - t0 < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and running(child):
        await asyncio.sleep(0.1)
    assert not running(child), "the program's child outlived it"


async def test_a_process_the_program_leaves_behind_does_not_hold_the_run(tmp_path):
    """A daemon the program starts in a session of its own (out of its group's reach) keeps the program's stdout
    open; the run still ends when the program does, with what it printed."""
    pid_file = tmp_path / "daemon.pid"
    script = ("import subprocess, sys; "
              "d = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
              f"open({str(pid_file)!r}, 'w').write(str(d.pid)); print('{{\"reward\": 0.5}}')")
    t0 = time.monotonic()
    try:
        out = await run_program(ProgramSettings(command=["{python}", "-c", script], timeout_s=30), {}, "")
        assert time.monotonic() - t0 < 15 and reward_line(out) == (0.5, {})
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def test_a_program_that_cannot_start_or_exits_non_zero_fails_with_the_reason():
    with pytest.raises(RunFailed, match="could not start '/no/such/agent'"):
        await run_program(ProgramSettings(command=["/no/such/agent"]), {}, "")
    script = "import sys; print('line 1', file=sys.stderr); print('the last words', file=sys.stderr); sys.exit(7)"
    with pytest.raises(RunFailed, match="exited with code 7: line 1 / the last words"):
        await run_program(ProgramSettings(command=["{python}", "-c", script]), {}, "")


@pytest.mark.parametrize(("stdout", "want"), [
    ("", (None, {})),
    ("thinking...\nthe answer is 4\n", (None, {})),
    ('{"reward": 1}\n', (1.0, {})),
    ('log line\n{"reward": 0.25, "reward_components": {"a": 1, "b": 0}}\n\n', (0.25, {"a": 1.0, "b": 0.0})),
    ('{"score": 3}', (None, {})),  # an object without "reward": not a reward line
    ("[1, 2]", (None, {})),
])
def test_reward_line(stdout, want):
    assert reward_line(stdout) == want


@pytest.mark.parametrize("line", ['{"reward": "1"}', '{"reward": true}', '{"reward": NaN}', '{"reward": 1e999}',
                                  '{"reward": 10' + "0" * 400 + "}", '{"reward": 1, "reward_components": {"a": "x"}}',
                                  '{"reward": 1, "reward_components": [1]}'])
def test_a_bad_reward_line_is_a_failed_run(line):
    with pytest.raises(RunFailed, match="reward"):
        reward_line(line)


def test_openai_agent_needs_a_command_and_sessions(tiny_model_dir):
    base = {"model": str(tiny_model_dir), "redis_url": "redis://127.0.0.1:1"}
    worker = {"enabled": True, "reward_url": "http://127.0.0.1:9", "rollout_function": "openai_agent"}
    with pytest.raises(ValueError, match="needs worker.program.command"):
        RolloutSettings(**base, worker=worker)
    with pytest.raises(ValueError, match="set sessions.enabled: true"):
        RolloutSettings(**base, worker={**worker, "program": {"command": PROGRAM}})
    with pytest.raises(ValueError, match="needs control_token"):
        RolloutSettings(**base, worker={**worker, "program": {"command": PROGRAM}}, sessions={"enabled": True})
    RolloutSettings(**base, worker={**worker, "program": {"command": PROGRAM}}, sessions={"enabled": True},
                    control_token="t")


async def test_the_program_gets_a_clean_environment(monkeypatch):
    """Only inherit_env of the service's environment, plus `env` and what the run adds: never the control token,
    REDIS_URL or HF_TOKEN (before, the program inherited the whole service environment)."""
    for k, v in {"FLEETRL_ROLLOUT_CONTROL_TOKEN": "secret", "REDIS_URL": "redis://:pw@h", "HF_TOKEN": "hf_x"}.items():
        monkeypatch.setenv(k, v)
    script = "import json, os; print(json.dumps(sorted(os.environ)))"
    cfg = ProgramSettings(command=["{python}", "-c", script], env={"MINE": "1"})
    names = set(json.loads((await run_program(cfg, {"OPENAI_API_KEY": "k"}, "")).strip().splitlines()[-1]))
    assert {"MINE", "OPENAI_API_KEY", "PATH"} <= names
    assert not names & {"FLEETRL_ROLLOUT_CONTROL_TOKEN", "REDIS_URL", "HF_TOKEN"}
    assert names <= {*cfg.inherit_env, "MINE", "OPENAI_API_KEY", "LC_CTYPE", "PWD"}  # what the OS may add itself


async def test_a_program_writing_without_bound_is_stopped_at_max_file_bytes(tmp_path):
    script = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    t0 = time.monotonic()
    with pytest.raises(RunFailed, match="more than 1048576 bytes .*worker.program.max_file_bytes"):
        await run_program(ProgramSettings(command=["{python}", "-c", script], max_file_bytes=1024 * 1024,
                                          timeout_s=30), {}, "")
    assert time.monotonic() - t0 < 20  # stopped by the cap, not the timeout


def test_the_task_json_has_no_label_and_the_printed_reward_is_off_unless_configured():
    from types import SimpleNamespace

    from services.rollout.agents.openai_agent import task_json
    from services.rollout.engines.types import SamplingParams

    assert ProgramSettings().reward_from_output is False
    task = PromptTask(id="t", prompt="2+2?", label="4", n=2)
    for show, want in ((False, None), (True, "4")):
        ctx = SimpleNamespace(task=task, params=SamplingParams(max_new_tokens=4), tokenizer=None,
                              settings=SimpleNamespace(program=ProgramSettings(show_label=show)))
        assert json.loads(task_json(ctx, 0)).get("label") == want
