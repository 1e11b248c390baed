"""Intra-op threads that follow the machine's idle cores, for services that share one machine.

On one host (``fleetrl run``: learner, rollout engine, reward, Redis on the same cores) each service holds a fixed
number of torch threads. With one each, a core sits idle whenever the other service waits (the rollout between
its batch and the next weights, the learner between steps); with one per core each, the two oversubscribe the
machine whenever both compute, and an OpenMP parallel region waits for its slowest, descheduled thread.

:class:`IdleCoreThreads` sits between: at each point its owner calls :meth:`IdleCoreThreads.adjust` (a learner
before each forward, backward and optimizer step; an engine before each decode step) it reads the kernel's count
of runnable tasks *now* (``/proc/loadavg``'s fourth field, a few microseconds), takes this process's own running
tasks off it, and sets the calling thread's intra-op threads to the cores nobody else is running on, between
``floor`` and ``cap``. A load-average or ``/proc/stat`` window would answer for the last second; the services
alternate within tens of milliseconds, so only the instantaneous count can follow them. On a machine other
tenants keep busy it stays at ``floor``; where ``/proc/loadavg`` is missing (not Linux) it stays at ``floor``.

torch stays out of this module: the owner passes ``torch.get_num_threads`` / ``torch.set_num_threads`` (which act
on the calling thread's OpenMP pool, so the owner adjusts from the thread that computes). CPU only: a CUDA
service has no use for it, and its owner does not build one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["IdleCoreThreads", "follow_idle_cores", "machine_cores", "own_running_tasks", "runnable_tasks",
           "torch_idle_cores"]


def machine_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def runnable_tasks(path: str = "/proc/loadavg") -> int | None:
    """Tasks running or ready to run on the whole machine now (the calling thread included), or None where the
    kernel does not say."""
    try:
        with open(path, "rb") as f:
            field = f.read().split()[3]
        return int(field.split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


def own_running_tasks(task_dir: str = "/proc/self/task") -> int:
    """This process's threads running or ready to run now (state ``R``; the calling thread is one)."""
    count = 0
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return 1
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        # "pid (comm) S ...": comm may hold spaces or parentheses; the state follows the last ')'
        if stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R":
            count += 1
    return max(count, 1)


class IdleCoreThreads:
    """Sets the calling thread's intra-op threads to the idle cores, between ``floor`` and ``cap``.

    ``get_threads`` / ``set_threads``: the thread pool's (torch's ``get_num_threads`` / ``set_num_threads``);
    ``cores``: the machine's (default: this process's affinity); ``runnable`` / ``own_running``: the two counts
    (tests pass their own)."""

    def __init__(self, floor: int, cap: int, get_threads: Callable[[], int], set_threads: Callable[[int], None], *,
                 cores: int | None = None, runnable: Callable[[], int | None] = runnable_tasks,
                 own_running: Callable[[], int] = own_running_tasks) -> None:
        if floor < 1 or cap < floor:
            raise ValueError(f"threads must satisfy 1 <= floor <= cap, got floor {floor}, cap {cap}")
        self.floor, self.cap = floor, cap
        self.cores = cores or machine_cores()
        self._get, self._set = get_threads, set_threads
        self._runnable, self._own_running = runnable, own_running
        self.changes = 0  # times adjust() changed the thread count (the owner's metrics)

    def want(self) -> int:
        """The thread count the machine has room for now."""
        total = self._runnable()
        if total is None:
            return self.floor
        # one thread wide, the caller is this process's one running compute thread (any other of its threads
        # counts as someone else's: the safe side); wider, the pool's workers may still be spinning from the last
        # parallel region, so this process's running threads are read and taken off the machine's count
        own = 1 if total <= 1 or self._get() <= 1 else self._own_running()
        others = max(0, total - own)
        return max(self.floor, min(self.cap, self.cores - others))

    def adjust(self) -> int:
        """Set the calling thread's intra-op threads to :meth:`want`; returns the count in force."""
        want = self.want()
        if want != self._get():
            self._set(want)
            self.changes += 1
        return want

    def settle(self) -> None:
        """Back to ``floor`` (the owner is about to wait: a pool that stays wide would spin on cores others need)."""
        if self._get() != self.floor:
            self._set(self.floor)
            self.changes += 1



def torch_idle_cores(floor: int, cap: int) -> IdleCoreThreads:
    """An :class:`IdleCoreThreads` on torch's intra-op pool (of the calling thread)."""
    import torch

    return IdleCoreThreads(floor, cap, torch.get_num_threads, torch.set_num_threads)


def follow_idle_cores(policy: IdleCoreThreads, models: Iterable[Any] = (), optimizers: Iterable[Any] = ()) -> None:
    """Adjust ``policy`` where the work is: before each forward of ``models`` (``torch.nn.Module``), at the start
    of each backward through a forward's output (a hook on the output tensor, run by the thread that drives the
    backward) and before each step of ``optimizers`` (``torch.optim.Optimizer``). All in the thread that
    computes, so the pool that changes is the one about to work."""
    import torch

    def before_forward(module: Any, args: Any) -> None:
        policy.adjust()

    def at_backward(grad: Any) -> None:
        policy.adjust()

    def after_forward(module: Any, args: Any, output: Any) -> None:
        out = getattr(output, "logits", output)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(at_backward)

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        policy.adjust()

    for model in models:
        model.register_forward_pre_hook(before_forward)
        model.register_forward_hook(after_forward)
    for optimizer in optimizers:
        optimizer.register_step_pre_hook(before_step)
