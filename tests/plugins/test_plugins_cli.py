"""``fleetrl plugins`` lists every plug-in point with its kinds and their settings; a service's ``plugins``
setting imports a module of your own first, so the kinds it registers are configurable in the same file."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from services.rollout.engines.settings import ENGINES
from services.rollout.settings import RolloutSettings
from shared.settings import SettingsError, load_settings

POINTS = ["engine", "scorer", "rollout function", "environment", "algorithm", "policy loss", "correction",
          "weight transport (replica)", "weight transport (publisher)"]


@pytest.fixture
def fresh_user_module():
    """tests.plugins.my_plugins not imported yet, and its engine unregistered afterwards."""
    sys.modules.pop("tests.plugins.my_plugins", None)
    ENGINES.unregister("my_engine_test")
    yield
    ENGINES.unregister("my_engine_test")
    sys.modules.pop("tests.plugins.my_plugins", None)


def test_the_listing_names_every_point_its_kinds_and_their_settings():
    out = CliRunner().invoke(app, ["plugins"])
    assert out.exit_code == 0, out.output
    for point in POINTS:
        assert f"\n{point}: " in out.output, point
    assert "  hf  ->  services.rollout.engines.hf.engine:HFEngine" in out.output
    assert "      max_batch_size: int = 64" in out.output
    assert "  custom  ->  (your own: the import path in its settings)" in out.output
    data = json.loads(CliRunner().invoke(app, ["plugins", "--json"]).output)
    assert sorted(p["point"] for p in data) == sorted(POINTS)
    grpo = next(k for p in data if p["point"] == "algorithm" for k in p["kinds"] if k["kind"] == "grpo")
    assert {"name": "norm_std", "type": "bool", "default": "True"}.items() <= grpo["fields"][0].items()


def test_your_own_module_is_listed_and_configurable_through_the_plugins_setting(fresh_user_module, tiny_model_dir):
    out = CliRunner().invoke(app, ["plugins", "--import", "tests.plugins.my_plugins"])
    assert out.exit_code == 0, out.output
    assert "  my_engine_test  ->  tests.plugins.test_engine_plugin:RepeatEngine" in out.output
    assert "      endpoint: str = 'http://127.0.0.1:1'" in out.output
    ENGINES.unregister("my_engine_test")
    sys.modules.pop("tests.plugins.my_plugins", None)

    engine = {"kind": "my_engine_test", "endpoint": "http://10.0.0.1:9"}
    with pytest.raises(SettingsError, match="unknown engine kind 'my_engine_test'"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), engine=engine)
    settings = load_settings(RolloutSettings, model=str(tiny_model_dir), plugins=["tests.plugins.my_plugins"],
                             engine=engine)
    assert type(settings.engine).__name__ == "TinyRemoteSettings" and settings.engine.endpoint == "http://10.0.0.1:9"


def test_a_plugins_module_that_does_not_import_is_a_one_line_error(tiny_model_dir):
    with pytest.raises(SettingsError, match="plugins: importing 'tests.plugins.no_such' raised ModuleNotFoundError"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), plugins=["tests.plugins.no_such"])
    out = CliRunner().invoke(app, ["plugins", "--import", "tests.plugins.no_such"])
    assert out.exit_code == 2 and "plugins: importing 'tests.plugins.no_such'" in out.output
