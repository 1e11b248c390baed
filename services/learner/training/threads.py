"""How many torch threads the learner trains with: a fixed count, or (``train.torch_threads_follow_idle``) the cores
the machine left idle plus those the learner used itself, measured over the last half second or more.

Why: in a local fleet the learner and the rollout engine share the machine's cores. A second torch thread makes a
step faster only while a core is free for it; on a core another process wants, the threads wait for each other at
every parallel region (an OpenMP barrier) and the step gets slower than on one thread. So the count follows what
was free: more threads while the rollout (or anything else) leaves cores idle, one when they are busy.

The measure is the machine's idle time (``/proc/stat``) and this process's CPU time between two decisions; the
count is re-decided before a training step once ``WINDOW_S`` has passed (a step's ~0.1 s is a handful of 10 ms
ticks). Where ``/proc/stat`` cannot be read the count stays where it is.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

WINDOW_S = 0.5
"""The shortest interval a decision is measured over."""
MARGIN = 0.3
"""Cores a little short of a whole one still count as one (a core idle 70 % of the time takes a thread)."""
PROC_STAT = Path("/proc/stat")


def cores_free(idle_cores: float, own_cores: float, cap: int) -> int:
    """Threads for the next steps: the idle cores plus those this process kept busy, rounded down with
    ``MARGIN``, at least 1 and at most ``cap``."""
    return max(1, min(cap, int(idle_cores + own_cores + MARGIN)))


def read_idle() -> tuple[float, float] | None:
    """(idle ticks, all ticks) summed over the machine's cores, from ``/proc/stat``'s ``cpu`` line; None where
    there is none."""
    try:
        first = PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 6:
        return None
    ticks = [float(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[3] + ticks[4], sum(ticks)


class TorchThreads:
    """The learner's torch thread count; :meth:`before_step` (in the thread that trains) applies it."""

    def __init__(self, fixed: int | None, follow_idle: bool) -> None:
        self.cap = fixed or len(os.sched_getaffinity(0))
        self.follow_idle = follow_idle
        self.threads = torch.get_num_threads()
        self._machine_cores = os.cpu_count() or 1
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, tuple[float, float] | None]:
        return time.monotonic(), time.process_time(), read_idle()

    def before_step(self) -> int:
        """Set (in the calling thread: torch's OpenMP count is per thread) and return the step's thread count."""
        if self.follow_idle:
            now = self._sample()
            wall = now[0] - self._last[0]
            if wall >= WINDOW_S and now[2] is not None and self._last[2] is not None:
                idle, total = now[2][0] - self._last[2][0], now[2][1] - self._last[2][1]
                if total > 0:
                    idle_cores = self._machine_cores * idle / total
                    own_cores = (now[1] - self._last[1]) / wall
                    threads = cores_free(idle_cores, own_cores, self.cap)
                    if threads != self.threads:
                        log.debug("torch threads %d -> %d (idle %.2f cores, this process %.2f)", self.threads,
                                  threads, idle_cores, own_cores)
                    self.threads = threads
                self._last = now
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return self.threads
