"""Run a benchmark with priority on a shared machine: ``COMMAND`` at nice ``--nice``, and every process at that nice
value (the command's children, whatever session they start) in an autogroup of nice ``--autogroup-nice``.

Why both: with ``/proc/sys/kernel/sched_autogroup_enabled`` set, Linux shares the CPU between autogroups (one per
session) first, so a plain ``nice`` acts only within the command's own session; ``fleetrl run``'s services and
Redis start sessions of their own. Each side of a comparison gets the same priority; other sessions still run.
Negative values need ``CAP_SYS_NICE`` (root). What ``docs/benchmarks.md`` (issue 43's runs) was measured with:

    python benchmarks/autogroup_nice.py -- .venv/bin/python benchmarks/vs_trl.py --tasks sort ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def nice_of(pid: str) -> int | None:
    """The nice value of ``pid`` (field 19 of ``/proc/PID/stat``), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[16])
    except (OSError, ValueError, IndexError):
        return None


def boost(nice: int, autogroup_nice: int) -> int:
    """Set the autogroup nice of every process at ``nice``; how many autogroups it changed."""
    changed = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if nice_of(pid) != nice:
            continue
        try:
            with open(f"/proc/{pid}/autogroup") as f:
                if f.read().strip().endswith(f"nice {autogroup_nice}"):
                    continue
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(autogroup_nice))
            changed += 1
        except OSError:
            pass  # gone meanwhile, or no autogroups on this kernel
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nice", type=int, default=-10, help="the command's nice value (what marks its processes)")
    ap.add_argument("--autogroup-nice", type=int, default=-15, help="the nice value of their autogroups")
    ap.add_argument("--poll-s", type=float, default=0.1, help="how often new processes are looked for")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command: autogroup_nice.py [--nice N] [--autogroup-nice M] -- COMMAND ARGS...")
    if args.nice == 0:
        ap.error("--nice 0 would mark every ordinary process of the machine; choose another value")
    proc = subprocess.Popen(["nice", "-n", str(args.nice), *cmd])
    try:
        while proc.poll() is None:
            boost(args.nice, args.autogroup_nice)
            time.sleep(args.poll_s)
    except KeyboardInterrupt:
        proc.terminate()
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
