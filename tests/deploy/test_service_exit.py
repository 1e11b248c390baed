"""A service stopped by the fleet ends as before (issue 28 made its exit prompt, shared/service_kit/process_exit.py):
by the SIGTERM it shut down on, its log ending with uvicorn's last line, its child processes gone; the same whether
it was spawned or forked from the zygote."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from deploy.local.fleet import Fleet
from deploy.local.zygote import Zygote, service_env

pytestmark = pytest.mark.process

SCORER = {"name": "brevity", "kind": "python", "function": "examples.reward.openrlhf_brevity:reward_func",
          "signature": "openrlhf", "sys_path": ["."], "max_workers": 2}


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("forked", [False, True], ids=["spawned", "forked"])
def test_a_sigtermed_service_ends_by_the_signal_with_its_last_line_and_no_children(tmp_path, forked):
    zygote = Zygote.start(service_env(1), tmp_path / "logs" / "zygote.log",
                          preload=("fastapi", "uvicorn", "services.reward.cli", "services.reward.app")) if forked else None
    with Fleet(run_dir=tmp_path, zygote=zygote) as fleet:
        svc = fleet.start("reward", "services.reward", {"scorers": [SCORER]})
        workers = children(svc.proc.pid)
        assert workers, "the python scorer's worker process runs beside the service"
        assert fleet.stop("reward", timeout=30) == -signal.SIGTERM  # uvicorn re-raises the signal it stopped on
    log = svc.log_path.read_text()
    assert log.rstrip().splitlines()[-1] == f"INFO:     Finished server process [{svc.proc.pid}]", log[-2000:]
    if forked:
        assert "forked services.reward" in (tmp_path / "logs" / "zygote.log").read_text()
    deadline = time.monotonic() + 10
    while not all(gone(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(w) for w in workers), "the scorer's workers were stopped with the service"
