import pytest

from services.rollout.settings import RolloutSettings
from shared.settings import SettingsError, load_settings


def test_partial_engine_section_defaults_to_hf(tiny_model_dir):
    s = load_settings(RolloutSettings, model=str(tiny_model_dir), engine={"device": "cpu"})
    assert (s.engine.kind, s.engine.device) == ("hf", "cpu")


def test_unknown_engine_kind_names_the_choices(tiny_model_dir):
    with pytest.raises(SettingsError, match="'hf', 'sglang', 'vllm'"):
        load_settings(RolloutSettings, model=str(tiny_model_dir), engine={"kind": "trt"})


@pytest.mark.parametrize(
    "worker, sidecar, expected",
    [(False, None, False), (True, None, True), (True, False, False), (False, True, True)],
)
def test_weight_sidecar_is_on_for_training_replicas(tiny_model_dir, worker, sidecar, expected):
    s = load_settings(RolloutSettings, model=str(tiny_model_dir), weight_sidecar=sidecar,
                      worker={"enabled": worker, "reward_url": "http://127.0.0.1:1"})
    assert s.sidecar_on is expected


@pytest.mark.parametrize("path", ["services.rollout.weights.routes:weight_router", "services.rollout.weights.routes:router",
                                  "services.rollout.routes.weights:router"])
def test_the_weight_routes_named_as_an_extension_are_refused_with_the_setting_that_serves_them(tiny_model_dir, path):
    # the old switch (a `weight_router` adapter, gone since weight_sidecar) named an attribute that no longer exists
    with pytest.raises(SettingsError) as err:
        load_settings(RolloutSettings, model=str(tiny_model_dir), extensions=[path])
    assert "set weight_sidecar: true" in str(err.value) and path in str(err.value)


@pytest.mark.process
def test_a_model_that_is_no_directory_and_no_hub_id_is_refused_at_once_naming_where_it_looked(tmp_path):
    """`fleetrl rollout --model sft-modle` (a typo) went to the model hub: on a machine without one it waited ~57 s
    for huggingface_hub's retries, then printed an OSError about huggingface.co. It is one line in a second now,
    saying where the directory was looked for; a directory without config.json is refused as before."""
    import subprocess
    import sys
    import time

    from tests.procs import REPO

    (tmp_path / "empty").mkdir()
    for model, want in (("sft-modle", (f"model: model 'sft-modle': no model directory at {tmp_path / 'sft-modle'} (a "
                                      f"relative path is relative to the current directory, {tmp_path}); a model hub "
                                      "id is written org/name")),
                        ("empty", "model: model 'empty': no Hugging Face checkpoint there (config.json missing)")):
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "services.rollout", "--model", model, "--port", "1"], cwd=tmp_path,
                             env={**__import__("os").environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                             text=True, timeout=50, check=False)
        assert out.returncode == 2, out.stderr[-2000:]
        assert out.stderr.strip().splitlines() == ["error: invalid settings (flags and environment):", f"  {want}"]
        assert time.monotonic() - t0 < 30  # the settings alone: no model hub, no engine


def test_the_models_a_setting_may_name(tmp_path, tiny_model_dir, monkeypatch):
    from shared.model_dir import model_dir_problem

    monkeypatch.chdir(tmp_path)
    assert model_dir_problem(str(tiny_model_dir)) is None and model_dir_problem("Qwen/Qwen2.5-0.5B") is None
    assert model_dir_problem("gpt-2").startswith(f"model 'gpt-2': no model directory at {tmp_path / 'gpt-2'}")
    assert model_dir_problem("/nowhere/m") == "model '/nowhere/m': no model directory at /nowhere/m; a model hub id " \
                                              "is written org/name"
    for bad in ("./a/b", "~/x"):
        assert "no model directory" in model_dir_problem(bad)
