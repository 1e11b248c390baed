"""The run's counters, counted once: a count moves the persisted number in :class:`RunState` (checkpointed, shown
by ``/status`` and the run's metrics) and the Prometheus counter of the same name together, so the two cannot
disagree (each collaborator used to bump both, and one bumped only the first)."""

from __future__ import annotations

from services.learner.observability import MetricsSink
from services.learner.run_state import RunState


class Counters:
    """``add(name, n)``: what the loop's collaborators count with (they get this, not the sink)."""

    def __init__(self, state: RunState, sink: MetricsSink) -> None:
        self.state = state
        self.sink = sink

    def add(self, name: str, n: int = 1) -> None:
        self.state.bump(name, n)
        self.sink.count(name, n)
