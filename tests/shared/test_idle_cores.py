"""shared/service_kit/idle_cores.py: intra-op threads that follow the machine's idle cores."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from pathlib import Path

import pytest

from shared.service_kit.idle_cores import IdleCoreThreads, own_running_tasks, runnable_tasks


class Pool:
    """A thread pool's count, as torch.get_num_threads / set_num_threads keep it."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, []

    def get(self) -> int:
        return self.n

    def set(self, n: int) -> None:
        self.n = n
        self.calls.append(n)


def policy(pool: Pool, total: int | None, own: int, floor: int = 1, cap: int = 4, cores: int = 4) -> IdleCoreThreads:
    return IdleCoreThreads(floor, cap, pool.get, pool.set, cores=cores, runnable=lambda: total,
                           own_running=lambda: own)


def test_an_idle_machine_gets_every_core_up_to_the_cap():
    pool = Pool(1)
    assert policy(pool, total=1, own=1).adjust() == 4
    assert pool.calls == [4]
    pool = Pool(1)
    assert policy(pool, total=1, own=1, cap=2).adjust() == 2


def test_one_thread_wide_every_other_runnable_task_is_someone_elses():
    # 4 cores, the caller and two others running: one core is free
    pool = Pool(1)
    p = policy(pool, total=3, own=3)  # own is not read one thread wide: the two others count (the safe side)
    assert p.adjust() == 2
    # a machine as busy as its cores (or busier) keeps the floor, and changes nothing
    pool = Pool(1)
    p = policy(pool, total=9, own=1)
    assert p.adjust() == 1 and pool.calls == [] and p.changes == 0


def test_wider_its_own_spinning_workers_are_not_taken_for_others():
    # 2 cores, 2 threads wide: the caller and its spinning worker are the 2 runnable tasks -> keep both
    pool = Pool(2)
    assert policy(pool, total=2, own=2, cap=2, cores=2).adjust() == 2 and pool.calls == []
    # the same count, but only the caller is ours: someone else runs -> back to one
    pool = Pool(2)
    p = policy(pool, total=2, own=1, cap=2, cores=2)
    assert p.adjust() == 1 and pool.calls == [1] and p.changes == 1


def test_the_floor_holds_and_an_unknown_count_means_the_floor():
    pool = Pool(3)
    assert policy(pool, total=50, own=3, floor=2).adjust() == 2
    pool = Pool(4)
    assert policy(pool, total=None, own=1, floor=1).adjust() == 1


def test_settle_returns_to_the_floor():
    pool = Pool(1)
    p = policy(pool, total=1, own=1)
    p.adjust()
    p.settle()
    assert pool.n == 1 and pool.calls == [4, 1] and p.changes == 2
    p.settle()
    assert pool.calls == [4, 1]


@pytest.mark.parametrize(("floor", "cap"), [(0, 2), (3, 2)])
def test_bad_bounds_are_refused(floor, cap):
    with pytest.raises(ValueError, match="floor"):
        IdleCoreThreads(floor, cap, lambda: 1, lambda n: None)


def test_the_counts_are_read_from_the_kernel_and_parse_odd_thread_names(tmp_path: Path):
    (tmp_path / "loadavg").write_text("0.52 0.61 0.70 3/412 12345\n")
    assert runnable_tasks(str(tmp_path / "loadavg")) == 3
    assert runnable_tasks(str(tmp_path / "missing")) is None
    (tmp_path / "bad").write_text("garbage\n")
    assert runnable_tasks(str(tmp_path / "bad")) is None
    tasks = tmp_path / "task"
    for tid, comm, state in [(1, "python", "R"), (2, "a) S (b", "R"), (3, "pool) R", "S"), (4, "x", "D")]:
        (tasks / str(tid)).mkdir(parents=True)
        (tasks / str(tid) / "stat").write_text(f"{tid} ({comm}) {state} 1 1 1 0 -1\n")
    assert own_running_tasks(str(tasks)) == 2
    assert own_running_tasks(str(tmp_path / "none")) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_thread_of_this_process_is_counted_as_its_own():
    assert (runnable_tasks() or 0) >= 1
    stop = threading.Event()

    data = b"x" * (1 << 20)

    def spin() -> None:  # hashing a large buffer releases the GIL: the thread runs beside the reader
        while not stop.is_set():
            hashlib.sha256(data).digest()

    t = threading.Thread(target=spin)
    t.start()
    try:
        seen = 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and seen < 2:
            seen = max(seen, own_running_tasks())
    finally:
        stop.set()
        t.join()
    assert seen >= 2


def test_hooks_adjust_before_forward_at_backward_and_before_the_optimizer_step():
    import torch

    from shared.service_kit.idle_cores import follow_idle_cores

    seen: list[str] = []

    class Spy(IdleCoreThreads):
        def adjust(self) -> int:
            seen.append(stage[0])
            return 1

    stage = ["forward"]
    policy = Spy(1, 2, lambda: 1, lambda n: None, runnable=lambda: 1, own_running=lambda: 1)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    follow_idle_cores(policy, [model], [opt])
    out = model(torch.randn(3, 4))
    assert seen == ["forward"]
    stage[0] = "backward"
    out.sum().backward()
    assert seen == ["forward", "backward"]
    stage[0] = "step"
    opt.step()
    assert seen == ["forward", "backward", "step"]
    with torch.no_grad():  # a forward-only pass (the reference, generation) adjusts once, before it
        stage[0] = "no_grad"
        model(torch.randn(3, 4))
    assert seen[-1] == "no_grad" and len(seen) == 4


def test_a_worker_thread_pool_follows_the_count():
    """torch's set_num_threads acts on the calling thread's pool: the hook runs in the thread that computes."""
    import torch

    from shared.service_kit.idle_cores import follow_idle_cores

    before = torch.get_num_threads()
    got: list[int] = []
    policy = IdleCoreThreads(1, 2, torch.get_num_threads, torch.set_num_threads, cores=2, runnable=lambda: 1,
                             own_running=lambda: 1)
    model = torch.nn.Linear(4, 2)
    follow_idle_cores(policy, [model])

    def work() -> None:
        torch.set_num_threads(1)
        model(torch.randn(2, 4))
        got.append(torch.get_num_threads())
        torch.set_num_threads(before)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert got == [2] and policy.changes == 1
