"""Settings and registry: every scorer kind maps to a class; config mistakes are clear errors."""

from __future__ import annotations

import pytest
import yaml

from services.reward.errors import CircuitOpen
from services.reward.scorer_config import SCORERS
from services.reward.scorers.base import Scorer
from services.reward.scorers.circuit_breaker import CircuitBreaker
from services.reward.scorers.registry import scorer_class
from services.reward.settings import RewardSettings
from shared.settings import SettingsError, load_settings
from tests.procs import REPO, run_module

KINDS = SCORERS.kinds()


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_a_scorer_class(kind):
    cls = scorer_class(kind)
    assert issubclass(cls, Scorer) and cls.kind == kind
    assert SCORERS.settings_model(kind).model_fields["kind"].default == kind


def _load(tmp_path, config):
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_settings(RewardSettings, config_file=path)


@pytest.mark.parametrize(
    ("scorers", "message"),
    [
        ([{"name": "a", "kind": "rule", "check": {"type": "math"}}] * 2, "scorer name 'a' is used twice"),
        ([{"name": "a", "kind": "magic"}], "scorers.0"),
        ([{"name": "a", "kind": "rule", "check": {"type": "math"}, "wieght": 2}], "unknown setting"),
        ([{"name": "a", "kind": "python", "function": "no_colon", "signature": "verl"}], "function"),
        ([{"name": "a", "kind": "python", "function": "m:f", "signature": "trl"}], "signature"),
        ([{"name": "a", "kind": "http", "url": "ftp://x", "protocol": "openrlhf"}], "url"),
        ([], "scorers"),
    ],
)
def test_config_errors_name_the_key(tmp_path, scorers, message):
    with pytest.raises(SettingsError, match=message):
        _load(tmp_path, {"scorers": scorers})


def test_example_configs_validate():
    for name in ("rules_only.yaml", "mixed_rm_rules.yaml", "python_and_remote.yaml"):
        settings = load_settings(RewardSettings, config_file=REPO / "examples" / "reward" / name)
        assert settings.scorers


@pytest.mark.process
def test_cli_exits_with_the_reason_on_a_bad_config(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"scorers": [{"name": "a", "kind": "rule", "check": {"type": "nope"}}]}))
    proc = run_module(["-m", "services.reward", "--config", str(path)], timeout=60)
    assert proc.returncode == 2
    assert "scorers.0" in proc.stderr and "check" in proc.stderr


def test_circuit_breaker_opens_half_opens_and_closes():
    now = [0.0]
    breaker = CircuitBreaker("x", failures=2, reset_s=5.0, clock=lambda: now[0])
    breaker.record_failure("boom")
    breaker.before_call()  # one failure: still closed
    breaker.record_failure("boom")
    with pytest.raises(CircuitOpen, match="last: boom"):
        breaker.before_call()
    now[0] = 6.0
    breaker.before_call()  # half-open: one trial goes through ...
    with pytest.raises(CircuitOpen):
        breaker.before_call()  # ... and only one
    breaker.record_success()
    breaker.before_call()
    assert not breaker.is_open


def test_a_control_token_is_refused_and_auth_token_is_the_reward_token(tmp_path, monkeypatch):
    """The reward service has no control routes: control_token is an unknown setting there (no shim); its
    bearer token is auth_token, a secret that is never printed."""
    monkeypatch.delenv("FLEETRL_REWARD_CONTROL_TOKEN", raising=False)
    scorers = [{"name": "a", "kind": "rule", "check": {"type": "math"}}]
    with pytest.raises(SettingsError, match="control_token: unknown setting"):
        _load(tmp_path, {"scorers": scorers, "control_token": "s3cret"})
    monkeypatch.setenv("FLEETRL_REWARD_CONTROL_TOKEN", "s3cret")
    with pytest.raises(SettingsError, match="FLEETRL_REWARD_CONTROL_TOKEN: unknown setting"):
        _load(tmp_path, {"scorers": scorers})
    monkeypatch.delenv("FLEETRL_REWARD_CONTROL_TOKEN")
    s = _load(tmp_path, {"scorers": scorers, "auth_token": "s3cret-token"})
    assert s.auth_token.get_secret_value() == "s3cret-token" and "s3cret" not in repr(s)
    assert _load(tmp_path, {"scorers": scorers}).auth_token is None
    with pytest.raises(SettingsError, match="auth_token is empty"):
        _load(tmp_path, {"scorers": scorers, "auth_token": " "})
