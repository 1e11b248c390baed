"""``fleetrl run`` end to end: a tiny spec trains a few steps with held-out accuracy before and after, the same
command resumes from the checkpoint, Ctrl-C stops every process, and a used run name is refused up front."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import redis
import yaml

from shared import keys
from tests.procs import REPO

pytestmark = [pytest.mark.slow, pytest.mark.process]  # whole `fleetrl run` fleets (resume ~45-75 s)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def fleetrl_run(spec_file, *sets: str, timeout: float = 180, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "deploy.cli", "run", str(spec_file), "--lines", *flags]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout, check=False)


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "learner" / "metrics.jsonl").read_text().splitlines()]


def test_a_tiny_run_trains_and_the_same_command_resumes(spec_file):
    run_dir = spec_file.parent / "run"
    first = fleetrl_run(spec_file)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "a fresh run" in first.stdout and "held-out accuracy at step 0:" in first.stdout
    assert "learner finished: step 2/2" in first.stdout and "held-out accuracy at step 2:" in first.stdout
    # the learner loads while the starting policy is measured, held at its start gate until that is done
    assert first.stdout.index("starting learner") < first.stdout.index("held-out accuracy at step 0:")
    step0 = next(line for line in first.stdout.splitlines() if "held-out accuracy at step 0:" in line)
    assert step0.endswith("weights v0)"), step0  # measured before the learner published anything
    assert "start gate open" in (run_dir / "logs" / "learner.log").read_text()
    zygote = (run_dir / "logs" / "zygote.log").read_text()  # every service forked from one set of imports
    assert all(f"forked services.{s}" in zygote for s in ("reward", "rollout", "learner")), zygote
    # the first step waits on the rollout's engine and the learner's trainer: they start first, the reward last
    out = first.stdout
    assert out.index("starting rollout-0") < out.index("starting learner") < out.index("starting reward-0"), out
    assert [m["step"] for m in metrics(run_dir)] == [1, 2]
    # issue 41: what is measured, said at the end (accuracy = reward >= eval.success_threshold, the mean beside it),
    # and what the model wrote: a few samples of step 1 (observability.log_every) with their reward and length
    assert re.search(r"held-out accuracy: [\d.]+% -> [\d.]+% \(mean reward [\d.-]+ -> [\d.-]+\), 2 steps, \d+ s",
                     first.stdout), first.stdout[-3000:]
    assert "mean reward" in step0 and "reward >= 1;" in step0
    logged = [json.loads(x) for x in (run_dir / "learner" / "samples.jsonl").read_text().splitlines()]
    assert logged and {r["step"] for r in logged} == {1} and all("response_tokens" in r for r in logged)
    assert all(k in metrics(run_dir)[-1] for k in ("response_len_mean", "truncated_frac"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and [e["step"] for e in summary["heldout"]] == [0, 2]
    assert summary["heldout"][-1]["weight_version"] == "2"  # measured on the learner's last version
    # Redis required a generated password and every record was signed with the run's key (issue 26): both in 0600
    # files, both given to every service that reaches Redis, neither shown anywhere
    password = (run_dir / "redis" / "password").read_text().strip()
    run_key = (run_dir / "run_key").read_text().strip()
    assert all((run_dir / f).stat().st_mode & 0o777 == 0o600 for f in ("redis/password", "run_key"))
    for name in ("rollout-0", "learner"):
        cfg = yaml.safe_load((run_dir / "configs" / f"{name}.yaml").read_text())
        assert f":{password}@" in cfg["redis_url"] and cfg["run_key"] == run_key, name
    shown = first.stdout + first.stderr + "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert password not in shown and run_key not in shown and "redis://:***@127.0.0.1" in first.stdout
    last = metrics(run_dir)[-1]
    assert last["experiences_unsigned"] == 0 and last["experiences_unissued"] == 0 and last["samples_trained"] > 0

    again = fleetrl_run(spec_file, "train.max_steps=3")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resuming from {run_dir / 'learner' / 'checkpoints'}" in again.stdout
    assert "held-out accuracy at step 0" not in again.stdout  # the starting policy was measured by the first run
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3]  # step 3 only: continued, not restarted
    assert "resuming from" in (run_dir / "logs" / "learner.log").read_text()

    def evals() -> list[int]:
        return [json.loads(line)["step"] for line in (run_dir / "eval.jsonl").read_text().splitlines()]

    assert evals() == [0, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())  # the whole run, not only the resumed launch
    assert [e["step"] for e in summary["heldout"]] == [0, 2, 3] and summary["launches"] == 2
    assert summary["heldout_before"] == summary["heldout"][0]["accuracy"] and summary["wall_time_s"] > 0
    assert "spec changed since the last start: train.max_steps grew 2 -> 3" in again.stdout
    done = fleetrl_run(spec_file, "train.max_steps=3", timeout=60)  # finished: said up front, nothing started
    assert done.returncode == 0 and "nothing to train: the run in" in done.stdout, done.stdout[-3000:]
    assert "finished at step 3 of 3; raise train.max_steps and it continues" in done.stdout
    assert "starting learner" not in done.stdout
    other = fleetrl_run(spec_file, "train.max_steps=4", "optim.actor_lr=0.0005", timeout=60)  # what trains changed
    assert other.returncode == 1 and "starting" not in other.stdout, other.stdout[-3000:]
    (line,) = [line for line in other.stdout.splitlines() if "error:" in line]
    assert "changed since this run was started: optim.actor_lr 0.001 -> 0.0005." in line
    assert "--reset" in line and "new run_name" in line
    # the hint repeats the command that was run, its --set included (issue 41: not another run's file)
    assert f"fleetrl run {spec_file} --set train.max_steps=4 --set optim.actor_lr=0.0005 --reset" in line
    assert [m["step"] for m in metrics(run_dir)] == [1, 2, 3]
    fresh = fleetrl_run(spec_file, "train.max_steps=1", flags=("--reset",))  # start over in the same run dir
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-3000:]
    assert "a fresh run" in fresh.stdout and [m["step"] for m in metrics(run_dir)] == [1]
    assert evals() == [0, 1]  # the held-out history is this run's, not the earlier run's rows and then these
    assert [e["step"] for e in json.loads((run_dir / "summary.json").read_text())["heldout"]] == [0, 1]


def test_ctrl_c_stops_every_process_and_a_used_run_name_is_refused(spec_file, redis_server):
    run_dir = spec_file.parent / "run"
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "run", str(spec_file), "--lines", "--set",
                             "train.max_steps=1000", "--set", "eval.data=null"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run_dir / "learner" / "metrics.jsonl").exists():
            time.sleep(0.5)
        assert (run_dir / "learner" / "metrics.jsonl").exists(), "no step within 120 s"
        second = fleetrl_run(spec_file, "train.max_steps=1000", "eval.data=null", timeout=60)  # the same run dir
        assert second.returncode == 1, second.stdout[-3000:]
        assert f"is in use by another fleetrl run (PID {proc.pid})" in second.stdout, second.stdout[-3000:]
        assert "Redis at" not in second.stdout and "a fresh run" not in second.stdout
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted: stopped; run the same command again to resume" in out
    configs = {p.stem: p.read_text() for p in (run_dir / "configs").glob("*.yaml")}
    assert set(configs) == {"reward-0", "rollout-0", "learner"}
    assert (run_dir / "learner" / "checkpoints" / "latest").exists()  # the learner checkpointed on its way out
    # summary.json says the step the learner stopped (and checkpointed) at, not the last one the display polled
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == metrics(run_dir)[-1]["step"]
    listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True, check=False).stdout
    for cfg in configs.values():
        port = next(line.split(":")[1].strip() for line in cfg.splitlines() if line.startswith("port:"))
        assert f":{port} " not in listening, f"port {port} still listening after Ctrl-C"

    client = redis.Redis.from_url(redis_server.url)
    client.sadd(keys.processed_ids("tiny", "learner"), "e0-0-0")  # an earlier run of that name on this Redis
    refused = fleetrl_run(spec_file, f"redis.url={redis_server.url}", "run_dir=fresh", timeout=60)
    assert refused.returncode == 1
    assert "run_name 'tiny' was used before" in refused.stdout and "--reset" in refused.stdout
    assert not (spec_file.parent / "fresh" / "logs" / "learner.log").exists()  # nothing was started
    client.delete(keys.processed_ids("tiny", "learner"))
    client.close()
