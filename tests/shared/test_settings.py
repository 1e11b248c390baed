import pytest
from pydantic import Field

from shared.settings import ServiceSettings, SettingsError, load_settings, service_config


class DemoSettings(ServiceSettings):
    model_config = service_config("DEMOSVC")
    model: str = Field(default="m", description="model dir")
    batch: int = Field(default=4, ge=1, description="batch")


def test_precedence_overrides_env_file_defaults(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: from-file\nbatch: 7\nport: 9000\n")
    monkeypatch.setenv("FLEETRL_DEMOSVC_BATCH", "9")
    s = load_settings(DemoSettings, cfg, port=1234)
    assert (s.model, s.batch, s.port, s.host) == ("from-file", 9, 1234, "127.0.0.1")


def test_toml_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('model = "t"\nbatch = 2\n')
    assert load_settings(DemoSettings, cfg).batch == 2


def test_unknown_key_in_file_is_an_error_naming_it(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("modle: typo\n")
    with pytest.raises(SettingsError, match="modle: unknown setting"):
        load_settings(DemoSettings, cfg)


def test_unknown_env_var_with_prefix_is_an_error(monkeypatch):
    monkeypatch.setenv("FLEETRL_DEMOSVC_BATCHH", "3")
    with pytest.raises(SettingsError, match="batchh"):
        load_settings(DemoSettings)


def test_bounds_are_enforced(tmp_path):
    with pytest.raises(SettingsError, match="batch"):
        load_settings(DemoSettings, batch=0)


def test_missing_file_and_non_mapping_file(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(DemoSettings, tmp_path / "nope.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(SettingsError, match="must hold a mapping"):
        load_settings(DemoSettings, bad)


def test_control_token_is_secret(monkeypatch):
    monkeypatch.setenv("FLEETRL_DEMOSVC_CONTROL_TOKEN", "s3cret")
    s = load_settings(DemoSettings)
    assert s.control_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)


def test_redis_url_comes_from_REDIS_URL_below_every_other_source(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETRL_DEMOSVC_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert load_settings(DemoSettings).redis_url is None
    monkeypatch.setenv("REDIS_URL", "redis://machine:6379/0")
    assert load_settings(DemoSettings).redis_url == "redis://machine:6379/0"
    assert DemoSettings().redis_url == "redis://machine:6379/0"  # built directly, too
    cfg = tmp_path / "c.yaml"
    cfg.write_text("redis_url: redis://file:6379/0\n")
    assert load_settings(DemoSettings, cfg).redis_url == "redis://file:6379/0"
    monkeypatch.setenv("FLEETRL_DEMOSVC_REDIS_URL", "redis://prefixed:6379/0")
    assert load_settings(DemoSettings, cfg).redis_url == "redis://prefixed:6379/0"
    assert load_settings(DemoSettings, cfg, redis_url="redis://flag:6379/0").redis_url == "redis://flag:6379/0"


def test_an_empty_REDIS_URL_is_unset(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "")
    assert load_settings(DemoSettings).redis_url is None
