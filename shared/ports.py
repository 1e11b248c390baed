"""Free TCP ports for the processes a local fleet, a test or a benchmark starts.

A port is free when :func:`free_port` looks, but the process it is meant for binds it seconds later (imports, a
model load). Processes that pick ports side by side (pytest-xdist workers, two ``fleetrl run`` on one machine,
the services a test starts) must not be handed the same one in that gap, so each port handed out is leased for
:data:`LEASE_S` seconds in a small file shared by every process of this user on the machine
(``$FLEETRL_PORT_LEASES``, default ``<tmp>/fleetrl-port-leases-<uid>.json``, under an ``flock``); a leased port
is not handed out again until its lease ends. Where that file cannot be used, the port is picked without a lease.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from pathlib import Path

LEASE_S = 120.0  # longer than any service here takes to bind the port it was given


def leases_path() -> Path:
    explicit = os.environ.get("FLEETRL_PORT_LEASES")
    if explicit:
        return Path(explicit)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"fleetrl-port-leases-{uid}.json"


def _bound_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _leases():
    """The live leases ({port: end}), read and written back under an exclusive lock; None without a usable file."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no leases
        yield None
        return
    try:
        fd = os.open(leases_path(), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield None
        return
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            try:
                raw = json.loads(f.read() or "{}")
            except ValueError:  # a writer died mid-write: start over
                raw = {}
            now = time.time()
            leases = {int(p): float(end) for p, end in raw.items() if float(end) > now}
            yield leases
            f.seek(0)
            f.truncate()
            f.write(json.dumps(leases))
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now and not handed out by this function to another process of this user
    within the last :data:`LEASE_S` seconds."""
    with _leases() as leases:
        if leases is None:
            return _bound_port(host)
        for _ in range(100):
            port = _bound_port(host)
            if port not in leases:
                leases[port] = time.time() + LEASE_S
                return port
        raise OSError(f"no free port on {host} that is not leased (leases in {leases_path()})")
