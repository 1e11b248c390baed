"""Shared by the Tinker tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def tinker_client() -> Iterator[Callable]:
    """``tinker_client(url, key)``: a ``tinker.ServiceClient`` closed when the test ends, before the servers its
    fixtures started stop; an open client's heartbeat thread outlives them and logs connection errors into later
    tests' output for minutes."""
    import tinker

    made: list = []

    def make(base_url: str, api_key: str):
        made.append(tinker.ServiceClient(base_url=base_url, api_key=api_key))
        return made[-1]

    yield make
    for client in made:
        close(client)


def close(client) -> None:
    """End the client's session (``close`` posts its finish) and its heartbeat thread; a server that is gone
    already cannot be told, and the thread still stops."""
    with contextlib.suppress(Exception):  # the server stopped first: nothing to tell it
        client.close("success").result(timeout=10)
