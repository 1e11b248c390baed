"""The weight sidecar's settings are the rollout settings' ``weights`` section: from the settings file, the
environment (``FLEETRL_ROLLOUT_WEIGHTS__*``) and flags alike; the old ``FLEETRL_WEIGHTS_*`` variables are
refused, not ignored."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.rollout.settings import RolloutSettings
from services.rollout.weights.sidecar import create_sidecar
from shared.settings import SettingsError, load_settings
from tests.procs import REPO


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for var in [v for v in os.environ if v.startswith(("FLEETRL_ROLLOUT_", "FLEETRL_WEIGHTS_"))]:
        monkeypatch.delenv(var)
    monkeypatch.delenv("REDIS_URL", raising=False)  # the settings read it when redis_url is not given


def test_the_section_comes_from_the_settings_file(tiny_model_dir, tmp_path):
    cfg = tmp_path / "rollout.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\nweights: {{backend: nccl, pause_mode: abort, join_timeout_s: 5}}\n")
    s = load_settings(RolloutSettings, cfg)
    assert (s.weights.backend, s.weights.pause_mode, s.weights.join_timeout_s) == ("nccl", "abort", 5.0)
    assert load_settings(RolloutSettings, model=str(tiny_model_dir)).weights.backend == "gloo"  # the default


def test_the_environment_overrides_the_file_key_by_key(tiny_model_dir, tmp_path, monkeypatch):
    cfg = tmp_path / "rollout.yaml"
    cfg.write_text(f"model: {tiny_model_dir}\nweights: {{backend: nccl, pause_mode: abort}}\n")
    monkeypatch.setenv("FLEETRL_ROLLOUT_WEIGHTS__PAUSE_MODE", "wait")
    s = load_settings(RolloutSettings, cfg)
    assert (s.weights.backend, s.weights.pause_mode) == ("nccl", "wait")


def test_a_misspelt_key_is_an_error(tiny_model_dir, monkeypatch):
    with pytest.raises(SettingsError, match="weights.bakend"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), weights={"bakend": "nccl"})
    monkeypatch.setenv("FLEETRL_ROLLOUT_WEIGHTS__BAKEND", "nccl")
    with pytest.raises(SettingsError, match="weights.bakend"):
        load_settings(RolloutSettings, model=str(tiny_model_dir))


def test_old_variables_are_refused_naming_the_new_setting(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("FLEETRL_WEIGHTS_BACKEND", "nccl")
    with pytest.raises(SettingsError) as err:
        load_settings(RolloutSettings, model=str(tiny_model_dir))
    assert "FLEETRL_WEIGHTS_BACKEND is no longer read" in str(err.value)
    assert "FLEETRL_ROLLOUT_WEIGHTS__BACKEND" in str(err.value) and "weights: {backend: ...}" in str(err.value)


@pytest.mark.process
def test_the_cli_stops_at_an_old_variable_with_one_line(tiny_model_dir):
    env = {"PATH": "/usr/bin:/bin", "FLEETRL_WEIGHTS_JOIN_TIMEOUT_S": "20"}
    out = subprocess.run([sys.executable, "-m", "services.rollout", "--model", str(tiny_model_dir)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    named = [line for line in out.stderr.splitlines() if "FLEETRL_WEIGHTS_JOIN_TIMEOUT_S" in line]
    assert len(named) == 1 and "FLEETRL_ROLLOUT_WEIGHTS__JOIN_TIMEOUT_S" in named[0], out.stderr


@pytest.mark.parametrize(("weights", "redis_url"), [({"enabled": False}, "redis://127.0.0.1:1/0"), ({}, None)])
def test_no_sidecar_when_it_is_off_or_there_is_no_redis(tiny_model_dir, weights, redis_url):
    s = load_settings(RolloutSettings, model=str(tiny_model_dir), weights=weights, redis_url=redis_url)
    assert create_sidecar(object(), s) is None


async def test_the_sidecar_is_built_from_the_section(tiny_model_dir):
    class Engine:
        kind, weight_sink, weight_version = "hf", "services.rollout.weights.sinks.hf:HFSink", 0

    s = load_settings(RolloutSettings, model=str(tiny_model_dir), redis_url="redis://127.0.0.1:1/0", port=8123,
                      run_name="r1", weights={"heartbeat_s": 0.5, "transport": "snapshot"})
    sidecar = create_sidecar(Engine(), s)
    try:
        assert sidecar.settings is s.weights and sidecar.run == "r1" and sidecar.name == "127.0.0.1:8123"
        assert sidecar.info().transport == "snapshot"
    finally:
        await sidecar.redis.aclose()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
async def test_a_wildcard_bind_advertises_a_reachable_peer_url(tiny_model_dir, host):
    """In a container the service binds 0.0.0.0; its peers must not be told http://0.0.0.0:8001 (a joiner then
    asked itself for the weights: compose's second replica never joined from a peer)."""
    from shared.advertise import default_url

    class Engine:
        kind, weight_sink, weight_version = "hf", "services.rollout.weights.sinks.hf:HFSink", 0

    s = load_settings(RolloutSettings, model=str(tiny_model_dir), redis_url="redis://127.0.0.1:1/0", port=8123,
                      host=host)
    sidecar = create_sidecar(Engine(), s)
    try:
        assert sidecar.peer_url == default_url(host, 8123) and "0.0.0.0" not in sidecar.peer_url
        assert "://::" not in sidecar.peer_url
        # its name in the registry (the learner's status, lag warnings) is that address, not the wildcard
        assert sidecar.name == sidecar.peer_url.split("://", 1)[1] and host not in sidecar.name.split(":")[0]
    finally:
        await sidecar.redis.aclose()
    s = load_settings(RolloutSettings, model=str(tiny_model_dir), redis_url="redis://127.0.0.1:1/0", port=8123,
                      host=host, advertise_url="http://rollout-3.internal:8001")
    sidecar = create_sidecar(Engine(), s)
    try:
        assert sidecar.peer_url == "http://rollout-3.internal:8001" and sidecar.name == "rollout-3.internal:8001"
    finally:
        await sidecar.redis.aclose()
