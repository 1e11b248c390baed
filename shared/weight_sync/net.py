"""Where the weight-sync sockets listen (torch-free): the publisher's rendezvous store on an address and port
the settings name, and the address each side's gloo sockets use. See README.md, "Trust boundary"."""

from __future__ import annotations

import ipaddress
import os
import socket

WILDCARDS = ("0.0.0.0", "::", "")


def is_wildcard(addr: str) -> bool:
    """True for an address that means every interface."""
    return addr.strip("[]") in WILDCARDS


def is_loopback(addr: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1); False for anything else."""
    host = addr.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _family(host: str) -> socket.AddressFamily:
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def listen(bind_addr: str, port: int = 0, span: int = 1) -> socket.socket:
    """A TCP socket bound to ``bind_addr`` and listening: on a free port the kernel picks (``port`` 0), or on
    the first free one of ``port`` .. ``port + span - 1``. Binding it here, before anything is announced,
    leaves no window in which another process could take the port."""
    host = bind_addr.strip("[]")
    family = socket.AF_INET6 if host == "::" else _family(host or "0.0.0.0")
    ports = [0] if port == 0 else list(range(port, port + span))
    last: OSError | None = None
    for p in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a previous group's port, in TIME_WAIT
            sock.bind((host, p))
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    where = f"port {port}" if len(ports) == 1 else f"ports {port}-{port + span - 1}"
    raise OSError(f"cannot listen on {bind_addr or '*'} {where}: {last} (each group the publisher holds at "
                  "once takes one port: raise rendezvous_ports, or free the ports)")


def connect_addr(sock: socket.socket) -> str:
    """The address a client on this host dials to reach the listening ``sock`` (loopback for a wildcard)."""
    host = sock.getsockname()[0]
    if is_wildcard(host):
        return "::1" if sock.family == socket.AF_INET6 else "127.0.0.1"
    return host


def route_addr(remote: str) -> str | None:
    """This host's address on the route to ``remote`` (127.0.0.1 for a local one); None if it has none.
    Nothing is sent: connecting a UDP socket only picks the route."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(remote.strip("[]"), 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError:
        return None


def gloo_interface() -> str | None:
    """``GLOO_SOCKET_IFNAME``'s first interface, which torch's default gloo device honours too."""
    names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    return names[0] if names else None
