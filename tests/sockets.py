"""Which TCP sockets a process listens on (psutil when installed, else /proc/<pid>/net/tcp{,6})."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on."""
    try:
        import psutil
    except ImportError:
        return _listening_proc(pid)
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def _listening_proc(pid: int) -> set[tuple[str, int]]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(addr_hex)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))  # 32-bit words in host order
            found.add((str(ipaddress.ip_address(raw)), int(port_hex, 16)))
    return found


def beyond_loopback(pid: int) -> list[tuple[str, int]]:
    """The sockets of ``pid`` that listen on anything but loopback (every interface included)."""
    from shared.weight_sync.net import is_loopback

    return sorted((a, p) for a, p in listening(pid) if not is_loopback(a))
