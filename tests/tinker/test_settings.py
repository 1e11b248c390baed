"""The Tinker mode's settings: the example file validates; a missing or non-``tml-`` key and a base_model that is
no model directory are one-line errors naming the setting (the CLI exits 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.learner.tinker.settings import TinkerSettings
from shared.settings import SettingsError, load_settings
from tests.procs import REPO


def test_the_example_file_validates(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("FLEETRL_TINKER_API_KEY", "tml-0123456789abcdef")
    s = load_settings(TinkerSettings, config_file=REPO / "examples/tinker/tinker.yaml", base_model=str(tiny_model_dir))
    assert s.port == 8010 and s.public_name() == str(tiny_model_dir)
    assert str(tiny_model_dir) in s.served_names()


@pytest.mark.parametrize(("key", "match"), [(None, "api_key"), ("sk-0123456789abcdef", "tml-")])
def test_the_api_key_is_required_and_tinker_shaped(tiny_model_dir, monkeypatch, key, match):
    monkeypatch.delenv("FLEETRL_TINKER_API_KEY", raising=False)
    overrides = {"api_key": key} if key else {}
    with pytest.raises(SettingsError, match=match):
        load_settings(TinkerSettings, base_model=str(tiny_model_dir), **overrides)


def test_cli_says_what_is_wrong_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "services.learner.tinker", "--base-model", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                         env={"PATH": "/usr/bin:/bin", "FLEETRL_TINKER_API_KEY": "tml-0123456789abcdef"})
    assert out.returncode == 2
    assert "base_model" in out.stderr and "config.json" in out.stderr and "Traceback" not in out.stderr
