"""The run's counters, counted once: a count moves the persisted number in :class:`RunState` (checkpointed, shown
by ``/status`` and the run's metrics) and the Prometheus counter of the same name together, so the two cannot
disagree (each collaborator used to bump both, and one bumped only the first). Nothing else writes
``RunState.counters``: the run state has no counting method of its own."""

from __future__ import annotations

from services.learner.observability import MetricsSink
from services.learner.run_state import RunState


class Counters:
    """``add(name, n)``: what the loop's collaborators count with (they get this, not the sink or the state)."""

    def __init__(self, state: RunState, sink: MetricsSink) -> None:
        self._counts = state.counters  # the persisted counts (the state's own dict, saved with each checkpoint)
        self._sink = sink

    def add(self, name: str, n: int = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + n
        self._sink.count(name, n)
