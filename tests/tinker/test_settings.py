"""The Tinker mode's settings: the example file validates; a missing or non-``tml-`` key and a base_model that is
no model directory are one-line errors naming the setting (the CLI exits 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.learner.tinker.settings import TinkerSettings
from shared.settings import SettingsError, load_settings
from tests.procs import REPO


@pytest.mark.process
def test_fleetrl_run_of_a_mode_tinker_file_serves_and_prints_the_exports(tiny_model_dir, tmp_path):
    """``fleetrl run FILE`` with ``mode: tinker`` (examples/tinker/fleetrl.yaml's shape, paths relative to the
    file): prints TINKER_BASE_URL / TINKER_API_KEY, and the key it made is the one the server wants."""
    import time

    import httpx
    import yaml

    from shared.ports import free_port
    from tests.procs import spawn, stop

    example = yaml.safe_load((REPO / "examples/tinker/fleetrl.yaml").read_text())
    assert example["mode"] == "tinker"
    port = free_port()
    spec = tmp_path / "fleetrl.yaml"
    spec.write_text(yaml.safe_dump({**example, "base_model": "model", "port": port, "run_dir": "run",
                                    "torch_threads": 1}))
    (tmp_path / "model").symlink_to(tiny_model_dir)
    log = tmp_path / "out.log"
    proc = spawn(["-m", "deploy.cli", "run", str(spec)], log)
    try:
        deadline = time.monotonic() + 120
        while "TINKER_API_KEY=" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.25)
        lines = dict(line.removeprefix("export ").split("=", 1) for line in log.read_text().splitlines()
                     if line.startswith("export TINKER_"))
        assert lines["TINKER_BASE_URL"] == f"http://127.0.0.1:{port}", log.read_text()
        assert lines["TINKER_API_KEY"].startswith("tml-")
        while time.monotonic() < deadline:
            try:
                r = httpx.post(f"{lines['TINKER_BASE_URL']}/api/v1/client/config", json={"sdk_version": "0.38.0"},
                               headers={"X-API-Key": lines["TINKER_API_KEY"]}, timeout=5)
                break
            except httpx.HTTPError:
                time.sleep(0.25)
        assert r.status_code == 200 and r.json()["pjwt_auth_enabled"] is False
        assert (tmp_path / "run" / "checkpoints").is_dir()  # run_dir relative to the file
    finally:
        stop(proc)


def test_the_example_file_validates_as_tinker_settings(tiny_model_dir, monkeypatch):
    import yaml

    raw = {k: v for k, v in yaml.safe_load((REPO / "examples/tinker/fleetrl.yaml").read_text()).items() if k != "mode"}
    monkeypatch.setenv("FLEETRL_TINKER_API_KEY", "tml-0123456789abcdef")
    s = load_settings(TinkerSettings, **{**raw, "base_model": str(tiny_model_dir)})
    assert s.port == 8010 and str(tiny_model_dir) in s.served_names()


@pytest.mark.parametrize(("key", "match"), [(None, "api_key"), ("sk-0123456789abcdef", "tml-")])
def test_the_api_key_is_required_and_tinker_shaped(tiny_model_dir, monkeypatch, key, match):
    monkeypatch.delenv("FLEETRL_TINKER_API_KEY", raising=False)
    overrides = {"api_key": key} if key else {}
    with pytest.raises(SettingsError, match=match):
        load_settings(TinkerSettings, base_model=str(tiny_model_dir), **overrides)


@pytest.mark.process
def test_cli_says_what_is_wrong_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "services.learner.tinker", "--base-model", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                         env={"PATH": "/usr/bin:/bin", "FLEETRL_TINKER_API_KEY": "tml-0123456789abcdef"})
    assert out.returncode == 2
    assert "base_model" in out.stderr and "config.json" in out.stderr and "Traceback" not in out.stderr


def test_rollout_sampling_needs_redis_and_http_urls(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("FLEETRL_TINKER_API_KEY", "tml-0123456789abcdef")
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(SettingsError, match="redis_url"):
        load_settings(TinkerSettings, base_model=str(tiny_model_dir), rollout_urls=["http://127.0.0.1:1"])
    with pytest.raises(SettingsError, match="not an http"):
        load_settings(TinkerSettings, base_model=str(tiny_model_dir), rollout_urls=["127.0.0.1:1"],
                      redis_url="redis://127.0.0.1:1/0")
    s = load_settings(TinkerSettings, base_model=str(tiny_model_dir), rollout_urls=["http://127.0.0.1:1"],
                      redis_url="redis://127.0.0.1:1/0", run_name="t")
    assert s.rollout_urls == ["http://127.0.0.1:1"] and s.sample_poller is False


@pytest.mark.parametrize(("extra", "match"), [
    ({"replicas": {"rollout": -1}}, "replicas: give `rollout: N`"),
    ({"replicas": {"rollout": 1, "reward": 1}}, "no other replicas"),
    ({"rollout": {"engine": {"kind": "hf"}}}, "needs replicas"),
])
def test_fleetrl_run_of_a_tinker_file_says_what_is_wrong_with_replicas(tiny_model_dir, tmp_path, capsys, extra, match):
    import yaml

    from deploy.run.tinker import serve_tinker

    spec = tmp_path / "fleetrl.yaml"
    spec.write_text(yaml.safe_dump({"mode": "tinker", "base_model": str(tiny_model_dir), **extra}))
    assert serve_tinker(spec) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1, err
