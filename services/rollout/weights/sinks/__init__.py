"""Engine-specific weight sinks (see :mod:`services.rollout.weights.sinks.base`)."""

from services.rollout.weights.sinks.base import (
    RoundFailed,
    UpdateRefused,
    WeightSink,
    create_sink,
    sink_class,
)

__all__ = ["RoundFailed", "UpdateRefused", "WeightSink", "create_sink", "sink_class"]
