"""``free_port``: a port handed out is leased, so processes picking ports side by side (pytest-xdist workers, the
services a test starts, two runs on one machine) are never given the same one before its owner binds it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from shared import ports
from tests.procs import REPO


@pytest.fixture()
def leases(tmp_path, monkeypatch):
    path = tmp_path / "leases.json"
    monkeypatch.setenv("FLEETRL_PORT_LEASES", str(path))
    return path


def offer(monkeypatch, *found: int) -> None:
    """The kernel's free ports, in the order it offers them."""
    it = iter(found)
    monkeypatch.setattr(ports, "_bound_port", lambda host: next(it))


def test_a_port_handed_out_is_not_handed_out_again_while_its_lease_runs(leases, monkeypatch):
    offer(monkeypatch, 40001, 40001, 40003)  # nobody bound 40001 yet, so the kernel offers it again
    assert ports.free_port() == 40001
    assert ports.free_port() == 40003
    assert set(json.loads(leases.read_text())) == {"40001", "40003"}


def test_a_lease_taken_by_another_process_is_respected_and_an_ended_one_is_dropped(leases, monkeypatch):
    leases.write_text(json.dumps({"40001": time.time() + 60, "40005": time.time() - 1}))
    offer(monkeypatch, 40001, 40005)
    assert ports.free_port() == 40005  # 40001 is another process's; 40005's lease ended
    assert set(json.loads(leases.read_text())) == {"40001", "40005"}


def test_a_torn_leases_file_is_started_over(leases, monkeypatch):
    leases.write_text('{"40001": 1')
    offer(monkeypatch, 40001)
    assert ports.free_port() == 40001


def test_without_a_usable_leases_file_a_free_port_is_still_given(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETRL_PORT_LEASES", str(tmp_path / "no-such-dir" / "leases.json"))
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.process
def test_processes_picking_ports_side_by_side_never_share_one(leases):
    """Four processes take 50 ports each at once from the real kernel: 200 distinct ports, each free."""
    code = "from shared.ports import free_port\nprint(' '.join(str(free_port()) for _ in range(50)))"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    got = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(got) == 200 and len(set(got)) == 200
    assert len(json.loads(leases.read_text())) == 200
