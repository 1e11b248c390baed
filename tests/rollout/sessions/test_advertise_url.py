"""The URL a replica advertises for its sessions (``advertise_url``, else from host and port)."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from services.rollout.sessions.registry import default_url, url_of_socket
from services.rollout.settings import RolloutSettings


def test_default_is_host_and_port():
    assert default_url("127.0.0.1", 8001) == "http://127.0.0.1:8001"
    assert default_url("rollout-3.internal", 9000) == "http://rollout-3.internal:9000"
    assert default_url("::1", 8001) == "http://[::1]:8001"


def test_a_wildcard_host_becomes_this_machines_address_or_name():
    url = default_url("0.0.0.0", 8001)
    host = url.removeprefix("http://").removesuffix(":8001")
    assert host and not host.startswith("127.") and host != "0.0.0.0"
    assert host == socket.gethostname() or socket.gethostbyname(socket.gethostname()) == host


def test_port_zero_is_known_from_the_bound_socket():
    assert default_url("127.0.0.1", 0) is None
    assert url_of_socket("127.0.0.1", {"server": ("127.0.0.1", 43123)}) == "http://127.0.0.1:43123"
    assert url_of_socket("127.0.0.1", {}) is None


def test_the_setting_must_be_an_absolute_http_url(tiny_model_dir):
    s = RolloutSettings(model=str(tiny_model_dir), advertise_url="http://10.0.3.7:8001/")
    assert s.advertise_url == "http://10.0.3.7:8001"
    for bad in ("10.0.3.7:8001", "rollout", "http://"):
        with pytest.raises(ValidationError, match="advertise_url"):
            RolloutSettings(model=str(tiny_model_dir), advertise_url=bad)
