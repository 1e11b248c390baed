"""A publish's round bytes by kind, the changed fraction and the round kind chosen reach /metrics
(fleetrl_weight_round_bytes_total{kind}, fleetrl_weight_changed_fraction, fleetrl_weight_delta_chosen,
fleetrl_weight_round_estimate_seconds{kind}) and the step's metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.learner.observability import MetricsSink
from services.learner.settings import ObservabilitySettings
from services.learner.weights.transport import PublishReport


def test_round_bytes_and_changed_fraction_are_exported(tmp_path):
    registry = CollectorRegistry()
    sink = MetricsSink(ObservabilitySettings(), tmp_path, registry)
    out = sink.observe_publish(PublishReport(version=2, round_bytes={"delta": 1000, "full": 50_000},
                                             changed_fraction=0.0125, loaded=["a"]))
    sink.observe_publish(PublishReport(version=3, round_bytes={"delta": 500}, changed_fraction=0.01))
    assert registry.get_sample_value("fleetrl_weight_round_bytes_total", {"kind": "delta"}) == 1500
    assert registry.get_sample_value("fleetrl_weight_round_bytes_total", {"kind": "full"}) == 50_000
    assert registry.get_sample_value("fleetrl_weight_changed_fraction") == 0.01
    assert out["publish_bytes_delta"] == 1000 and out["publish_changed_fraction"] == 0.0125


def test_the_round_kind_chosen_and_its_estimates_are_exported(tmp_path):
    registry = CollectorRegistry()
    sink = MetricsSink(ObservabilitySettings(), tmp_path, registry)
    out = sink.observe_publish(PublishReport(version=2, delta_choice={"kind": "delta", "reason": "first",
                                                                      "full_s": 0.31, "delta_s": None}))
    assert registry.get_sample_value("fleetrl_weight_delta_chosen") == 1
    assert registry.get_sample_value("fleetrl_weight_round_estimate_seconds", {"kind": "full"}) == 0.31
    assert registry.get_sample_value("fleetrl_weight_round_estimate_seconds", {"kind": "delta"}) is None
    assert out["publish_delta_chosen"] == 1 and out["publish_round_s_full"] == 0.31 and "publish_round_s_delta" not in out
    out = sink.observe_publish(PublishReport(version=3, delta_choice={"kind": "full", "reason": "faster",
                                                                      "full_s": 0.3, "delta_s": 0.45}))
    assert registry.get_sample_value("fleetrl_weight_delta_chosen") == 0
    assert registry.get_sample_value("fleetrl_weight_round_estimate_seconds", {"kind": "delta"}) == 0.45
    assert out["publish_delta_chosen"] == 0 and out["publish_round_s_delta"] == 0.45
    assert "publish_delta_chosen" not in sink.observe_publish(PublishReport(version=4))  # no choice made (adapter)
