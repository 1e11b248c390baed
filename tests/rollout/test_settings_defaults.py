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
