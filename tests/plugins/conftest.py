"""Contract tests of the plug-in points: for each, a third-party plug-in defined in the test module registers,
is configured through the point's normal settings, and runs through the real code path that uses the point."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.plugins import PluginPoint


@pytest.fixture
def registered() -> Iterator:
    """``registered(point, kind, settings, impl)``: register for this test only (the registry is put back)."""
    done: list[tuple[PluginPoint, str]] = []

    def register(point: PluginPoint, kind: str, settings, impl) -> None:
        point.register(kind, settings, impl)
        done.append((point, kind))

    yield register
    for point, kind in done:
        point.unregister(kind)
