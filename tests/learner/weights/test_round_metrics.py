"""A publish's round bytes by kind and the changed fraction reach /metrics (fleetrl_weight_round_bytes_total{kind},
fleetrl_weight_changed_fraction) and the step's metrics."""

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
