"""The learner's torch thread count: fixed, or following the cores the machine left idle."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from services.learner.training import threads as T


def test_cores_free_rounds_down_with_the_margin_and_stays_within_bounds() -> None:
    assert T.cores_free(idle_cores=1.0, own_cores=0.75, cap=2) == 2  # 1.75 + 0.3
    assert T.cores_free(idle_cores=0.6, own_cores=0.6, cap=4) == 1  # 1.2 + 0.3 = 1.5
    assert T.cores_free(idle_cores=0.05, own_cores=0.4, cap=2) == 1  # a busy machine: never fewer than one
    assert T.cores_free(idle_cores=7.9, own_cores=1.0, cap=2) == 2  # never more than the cap


def test_read_idle_sums_idle_and_iowait_over_the_cpu_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 20 1 2 3 0 0\ncpu0 50 2 25 400 10 0 1 1 0 0\n")
    monkeypatch.setattr(T, "PROC_STAT", stat)
    assert T.read_idle() == (820.0, 981.0)
    stat.write_text("intr 1 2 3\n")
    assert T.read_idle() is None
    monkeypatch.setattr(T, "PROC_STAT", tmp_path / "missing")
    assert T.read_idle() is None


def _run_in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", (fn(), torch.get_num_threads())))
    t.start()
    t.join()
    return out["v"]


def test_following_idle_cores_sets_the_training_threads_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    stat = tmp_path / "stat"
    monkeypatch.setattr(T, "PROC_STAT", stat)
    monkeypatch.setattr(T.os, "cpu_count", lambda: 2)
    clock = {"wall": 100.0, "cpu": 10.0}
    monkeypatch.setattr(T.time, "monotonic", lambda: clock["wall"])
    monkeypatch.setattr(T.time, "process_time", lambda: clock["cpu"])
    stat.write_text("cpu  0 0 0 0 0 0 0 0\n")
    try:
        policy = T.TorchThreads(fixed=2, follow_idle=True)
        # a quiet machine: over 1 s, one of the 2 cores idle 90 % of the time, this process busy 0.8 of a core
        stat.write_text("cpu  110 0 0 90 0 0 0 0\n")
        clock.update(wall=101.0, cpu=10.8)
        assert _run_in_thread(policy.before_step) == (2, 2)  # set in the thread that trains
        # a busy machine: nothing idle, this process got 0.5 of a core
        stat.write_text("cpu  310 0 0 90 0 0 0 0\n")
        clock.update(wall=102.0, cpu=11.3)
        assert _run_in_thread(policy.before_step) == (1, 1)
        # less than the window since the last decision: the count stays
        stat.write_text("cpu  310 0 0 290 0 0 0 0\n")
        clock.update(wall=102.2, cpu=11.3)
        assert policy.before_step() == 1
    finally:
        torch.set_num_threads(before)


def test_a_fixed_count_is_kept_whatever_the_machine_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        policy = T.TorchThreads(fixed=1, follow_idle=False)
        stat = tmp_path / "stat"
        monkeypatch.setattr(T, "PROC_STAT", stat)
        stat.write_text("cpu  0 0 0 1000 0 0 0 0\n")  # all idle: a following policy would take more

        def other_count_then_step() -> int:
            torch.set_num_threads(2)  # what another caller left in this thread
            return policy.before_step()

        assert _run_in_thread(other_count_then_step) == (1, 1)
    finally:
        torch.set_num_threads(before)
