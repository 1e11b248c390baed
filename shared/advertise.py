"""The URL a service tells others to reach it at, from the address it binds (a wildcard bind is no address)."""

from __future__ import annotations

import socket


def default_url(host: str, port: int) -> str | None:
    """``http://<host>:<port>``; a wildcard host (0.0.0.0, ::) becomes the address of the machine's hostname
    (in a container or pod: its IP on the network), else the hostname itself. None for port 0 (the port is
    known once bound: :func:`url_of_socket`)."""
    if port == 0:
        return None
    if host in ("", "0.0.0.0", "::", "[::]"):
        name = socket.gethostname()
        try:
            addr = socket.gethostbyname(name)
        except OSError:
            addr = ""
        host = addr if addr and not addr.startswith("127.") else name
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"
