"""A user's own reward server, a real process of its own, killed while a real ``fleetrl run`` trains: after
``reward.stall_after_s`` the run says ``stalled: reward scorer 'myrm' at <url> unreachable ...`` (and the reward
service's ``/health`` names it in ``failing``); the server started again before ``reward.give_up_after_s`` and
the run says so and trains on; killed again for longer, the run stops with the stalled line and the learner's
checkpoint of the step it reached (the same command resumes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from shared.ports import free_port
from tests.deploy.run.conftest import tiny_spec, with_remote_scorer
from tests.procs import REPO, kill9, stop
from tests.reward.conftest import start_openrlhf_stub

pytestmark = [pytest.mark.slow, pytest.mark.process]  # a whole `fleetrl run` fleet (~60-120 s on 2 cores)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
STALL_AFTER_S, GIVE_UP_AFTER_S = 2, 30  # the server restarts in ~10 s on 2 loaded cores


class Lines:
    """``fleetrl run``'s output, read as it comes (a thread), each line with when it came."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait(self, pattern: str, timeout: float, after: float = 0.0) -> tuple[float, re.Match]:
        """The first line that came after ``after`` (a monotonic time) and matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for when, line in list(self.lines):
                if when >= after and (found := re.search(pattern, line)):
                    return when, found
            if self.proc.poll() is not None and not any(when >= after for when, _ in self.lines[-1:]):
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{self.text()[-4000:]}")


def test_a_reward_server_killed_mid_run_stalls_it_comes_back_and_the_run_gives_up_with_a_checkpoint(
        tmp_path, tiny_model_dir):
    port = free_port()
    server = start_openrlhf_stub(tmp_path, port)  # the user's own server: OpenRLHF's POST /get_reward
    url = f"http://127.0.0.1:{port}/get_reward"
    # the circuit opened by the failures tries the server again after 2 s (10 s by default)
    spec = with_remote_scorer(tiny_spec(tmp_path, tiny_model_dir), url, breaker_reset_s=2)
    run_dir = tmp_path / "run"
    sets = ["train.max_steps=100000", "eval.data=null", "checkpoint_every=100000",  # only the exit checkpoint
            f"reward.stall_after_s={STALL_AFTER_S}", f"reward.give_up_after_s={GIVE_UP_AFTER_S}"]
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "run", str(spec), "--lines",
                             *[a for s in sets for a in ("--set", s)]],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Lines(proc)
    where = f"reward scorer 'myrm' at {url}"
    try:
        _, reward = out.wait(r"starting reward-0 \((http://[\d.:]+)\)", 120)
        out.wait(r"step [1-9]\d*/100000 ", 180)  # training: steps move on the server's rewards

        kill9(server.proc)  # the server dies mid-run
        killed = time.monotonic()
        said, stalled = out.wait(rf"stalled: {re.escape(where)} failing for (\d+) s \(last error: (.*)\)$", 60,
                                 after=killed)
        assert said - killed >= STALL_AFTER_S and int(stalled[1]) >= STALL_AFTER_S
        assert stalled[2] == "cannot connect (Connection refused)"  # the server's failure, not the breaker's words
        failing = httpx.get(f"{reward[1]}/health", timeout=10).json()["failing"]["myrm"]
        assert failing["where"] == where and failing["error"] == "cannot connect (Connection refused)"
        steps = [int(m[1]) for _, line in out.lines if (m := re.search(r"step (\d+)/100000 ", line))]

        server = start_openrlhf_stub(tmp_path, port)  # back before give_up_after_s: the run goes on
        back, _ = out.wait(rf"back: {re.escape(where)} answers again after \d+ s or more of failing; the run goes on",
                           60, after=said)
        assert back - killed < GIVE_UP_AFTER_S
        _, moved = out.wait(r"step (\d+)/100000 ", 120, after=back)
        assert int(moved[1]) > max(steps)
        assert "gave up" not in out.text()

        kill9(server.proc)  # dead for longer than give_up_after_s: the run stops with the stalled line
        killed = time.monotonic()
        proc.wait(timeout=GIVE_UP_AFTER_S + 150)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        stop(server.proc)
    text = out.text()
    assert proc.returncode == 1, text[-4000:]
    stopping, _ = out.wait(r"stopping the learner \(it checkpoints first\)", 5, after=killed)
    assert GIVE_UP_AFTER_S <= stopping - killed <= ended - killed
    (error,) = [line for _, line in out.lines if "] error: " in line]
    assert re.search(rf"error: stalled: {re.escape(where)} failing for \d+ s \(last error: cannot connect "
                     rf"\(Connection refused\)\); gave up after reward.give_up_after_s = {GIVE_UP_AFTER_S} s "
                     r"\(the learner checkpoints; fix the scorer and run fleetrl run .* to resume\)", error), error
    assert "Traceback" not in text
    # the learner checkpointed the step it reached on its way out (checkpoint_every is far away)
    last_step = json.loads((run_dir / "learner" / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    latest = (run_dir / "learner" / "checkpoints" / "latest").read_text().strip()
    assert latest.endswith(f"{last_step:08d}") and last_step >= int(moved[1]), (latest, last_step)
