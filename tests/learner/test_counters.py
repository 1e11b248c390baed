"""One count, two places: ``Counters.add`` moves the run state's persisted count (checkpointed, /status) and the
Prometheus counter of the same name together, continuing from a resumed checkpoint's counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.learner.counters import Counters
from services.learner.observability import MetricsSink
from services.learner.run_state import RunState
from tests.learner.helpers import settings


def test_a_count_moves_the_persisted_number_and_prometheus_together(tmp_path):
    s = settings(tmp_path, tmp_path, observability={"progress_bar": False})
    registry = CollectorRegistry()
    state = RunState.from_json(RunState(counters={"prompts_reissued": 5}).to_json())  # as a resume loads it
    counters = Counters(state, MetricsSink(s.observability, tmp_path / "run", registry))
    counters.add("prompts_reissued")
    counters.add("experiences_dropped_stale", 4)
    assert state.counters["prompts_reissued"] == 6 and state.counters["experiences_dropped_stale"] == 4
    # Prometheus counts this process's events (a restarted learner's counters start at 0 there)
    assert registry.get_sample_value("fleetrl_learner_prompts_reissued_total") == 1
    assert registry.get_sample_value("fleetrl_learner_experiences_dropped_stale_total") == 4
