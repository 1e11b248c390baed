"""A module of plug-ins as a user would ship one: importing it registers them (a service's ``plugins`` setting,
or ``fleetrl plugins --import``, names it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.rollout.engines.settings import ENGINES, EngineSettingsBase


class TinyRemoteSettings(EngineSettingsBase):
    """An engine of a user's own (its class is named by import path and never loaded in these tests)."""

    kind: Literal["my_engine_test"] = "my_engine_test"
    endpoint: str = Field(default="http://127.0.0.1:1", description="Where it runs.")


ENGINES.register("my_engine_test", TinyRemoteSettings, "tests.plugins.test_engine_plugin:RepeatEngine")
