"""Engine-specific weight sinks (see :mod:`services.rollout.weights.sinks.base`)."""

from services.rollout.weights.sinks.base import (
    RoundFailed,
    UpdateRefused,
    WeightSink,
    create_sink,
    register_sink,
)

__all__ = ["RoundFailed", "UpdateRefused", "WeightSink", "create_sink", "register_sink"]
