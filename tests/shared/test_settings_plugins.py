"""The load step of a service's settings (``shared.settings.load_settings``): the modules its
``plugins`` name are imported first (``sys_path`` first on ``sys.path``), read from the same sources as the rest
(overrides, ``FLEETRL_<SERVICE>_*``, the config file), so the kinds they register can be configured in the same
settings; validating settings never imports, and settings built otherwise that name modules not imported are
refused in one line."""

from __future__ import annotations

import json
import sys
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.plugins import POINTS, PluginPoint
from shared.settings import ServiceSettings, SettingsError, load_settings, service_config


class Widget:
    """What the test point's kinds are."""


class RoundSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["round"] = "round"


PLUGIN = '''
from typing import Literal
from pydantic import BaseModel, ConfigDict
from shared.plugins import POINTS
from tests.shared.test_settings_plugins import Widget

class SquareSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["square"] = "square"
    side: int = 1

class Square(Widget):
    pass

POINTS["test widget"].register("square", SquareSettings, Square)
'''


@pytest.fixture
def widgets():
    """A plug-in point of widgets (kind ``round`` built in) and a service's settings with a widget section; the
    point is dropped afterwards."""
    point: PluginPoint = PluginPoint("test widget", where="test: widget.kind", doc="Widgets.", base=Widget,
                                     default="round")
    point.register("round", RoundSettings, Widget)

    class WidgetServiceSettings(ServiceSettings):
        model_config = service_config("WIDGETSVC")
        widget: point.settings_type("WidgetSettings") = Field(default_factory=RoundSettings)  # type: ignore[valid-type]

    yield point, WidgetServiceSettings
    POINTS.pop("test widget")


@pytest.fixture
def plugin_module(tmp_path, monkeypatch, widgets):
    """A module of the operator's beside its config (not importable until ``sys_path`` names its directory)
    that registers the widget kind ``square``; forgotten afterwards."""
    name = f"widget_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the load step's sys_path entries are undone
    yield name
    sys.modules.pop(name, None)


def test_a_plugin_named_in_overrides_registers_a_kind_the_same_settings_configure(widgets, plugin_module, tmp_path):
    point, WidgetServiceSettings = widgets
    with pytest.raises(SettingsError, match="unknown test widget kind 'square'"):
        load_settings(WidgetServiceSettings, widget={"kind": "square"})
    s = load_settings(WidgetServiceSettings, plugins=[plugin_module], sys_path=[str(tmp_path)], widget={"kind": "square",
                                                                                                  "side": 3})
    assert type(s.widget).__name__ == "SquareSettings" and s.widget.side == 3  # type: ignore[attr-defined]
    assert s.plugins == [plugin_module] and sys.path[0] == str(tmp_path)
    assert point.load("square").__module__ == plugin_module


def test_a_plugin_named_in_the_environment_is_imported_by_the_load_step(widgets, plugin_module, tmp_path, monkeypatch):
    _, WidgetServiceSettings = widgets
    monkeypatch.setenv("FLEETRL_WIDGETSVC_PLUGINS", json.dumps([plugin_module]))
    monkeypatch.setenv("FLEETRL_WIDGETSVC_SYS_PATH", json.dumps([str(tmp_path)]))
    monkeypatch.setenv("FLEETRL_WIDGETSVC_WIDGET", json.dumps({"kind": "square", "side": 2}))
    s = load_settings(WidgetServiceSettings)
    assert s.widget.side == 2 and plugin_module in sys.modules  # type: ignore[attr-defined]


def test_a_plugin_named_in_the_config_file_is_imported_by_the_load_step_below_overrides(widgets, plugin_module,
                                                                                         tmp_path):
    point, WidgetServiceSettings = widgets
    cfg = tmp_path / "svc.yaml"
    cfg.write_text(f"plugins: [{plugin_module}]\nsys_path: ['{tmp_path}']\nwidget: {{kind: square, side: 5}}\n")
    assert load_settings(WidgetServiceSettings, cfg).widget.side == 5  # type: ignore[attr-defined]
    # an override of plugins wins over the file's, as for every setting: the file's module is not imported
    sys.modules.pop(plugin_module, None)
    point.unregister("square")
    with pytest.raises(SettingsError, match="unknown test widget kind 'square'"):
        load_settings(WidgetServiceSettings, cfg, plugins=["json"])
    assert plugin_module not in sys.modules


def test_a_plugin_that_does_not_import_is_a_one_line_error_naming_the_setting(widgets, tmp_path):
    _, WidgetServiceSettings = widgets
    cfg = tmp_path / "svc.yaml"
    cfg.write_text("plugins: [widget_plugin_not_there]\n")
    with pytest.raises(SettingsError) as err:
        load_settings(WidgetServiceSettings, cfg)
    assert str(err.value).splitlines() == [
        f"invalid settings ({cfg}):",
        ("  plugins: importing 'widget_plugin_not_there' raised ModuleNotFoundError: No module named "
        "'widget_plugin_not_there'")]


def test_validating_settings_never_imports_and_refuses_plugins_not_imported(widgets, plugin_module, tmp_path):
    point, WidgetServiceSettings = widgets
    path_before = list(sys.path)
    with pytest.raises(ValidationError) as err:
        WidgetServiceSettings(plugins=[plugin_module], sys_path=[str(tmp_path)])
    assert plugin_module not in sys.modules and sys.path == path_before and "square" not in point
    [problem] = err.value.errors()
    assert problem["loc"] == ("plugins",)
    assert (f"plugins '{plugin_module}' are not imported: build the settings with shared.settings.load_settings(WidgetServiceSettings, ...)"
            in problem["msg"])
    assert WidgetServiceSettings(plugins=["json"]).plugins == ["json"]  # imported already: nothing to do
