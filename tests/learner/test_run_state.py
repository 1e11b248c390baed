"""``run_state.json``: what a checkpoint of an earlier learner wrote still loads (its commit lists go to the run's
``Commits``, not into the live state), and what this one writes has the same fields."""

from __future__ import annotations

import json

from services.learner.run_state import COUNTERS, CommitIds, InFlight, RunState

# written by the learner before Commits owned the commit lists (RunState.to_json of main at e43feb5), with a
# position issued before InFlight recorded group_size, dead letters and stale drops
EARLIER = json.dumps({
    "epoch": 1, "next_index": 3,
    "in_flight": {"e1-2": {"epoch": 1, "index": 2, "attempt": 1, "issued_at": 12.5, "entry": "5-0", "group_size": 4,
                           "dead_letters": 1, "stale_drops": 2},
                  "e0-7": {"epoch": 0, "index": 7, "attempt": 0, "issued_at": 10.0}},
    "weight_version": 9,
    "dead_letter_cursors": {"prompts": "7-0"},
    "abandoned": {"e0-4": "poison"},
    "counters": {"samples_trained": 40, "prompts_issued": 12},
    "grant_key": "ab" * 32,
    "commit_sample_ids": ["e0-1#0", "e0-1#1"],
    "commit_entry_ids": ["3-0", "3-1", "4-0"],
})


def test_a_run_state_written_by_an_earlier_learner_loads_with_its_recorded_commit(tmp_path):
    path = tmp_path / "run_state.json"
    path.write_text(EARLIER)
    state, recorded = RunState.load_with_commit(path)
    assert (state.epoch, state.next_index, state.weight_version, state.grant_key) == (1, 3, 9, "ab" * 32)
    assert state.in_flight["e1-2"] == InFlight(1, 2, 1, 12.5, "5-0", 4, 1, 2)
    assert state.in_flight["e0-7"] == InFlight(0, 7, 0, 10.0)  # the fields it lacks take their defaults
    assert state.dead_letter_cursors == {"prompts": "7-0"} and state.abandoned == {"e0-4": "poison"}
    assert state.counters["samples_trained"] == 40 and set(COUNTERS) <= set(state.counters)
    assert state.counters["redis_outages"] == 0  # a counter added since starts at 0
    assert recorded == CommitIds(("e0-1#0", "e0-1#1"), ("3-0", "3-1", "4-0"))
    assert RunState.load(path) == state  # the modes without commits (SFT, preference) read the state alone


def test_a_checkpoint_written_now_has_the_fields_of_the_earlier_format_and_reads_back():
    state, recorded = RunState.parse(EARLIER)
    text = state.to_json(recorded)
    assert list(json.loads(text)) == list(json.loads(EARLIER))  # the same fields, in the same order
    again, commit = RunState.parse(text)
    assert again == state and commit == recorded
    # with nothing to settle the lists are written empty, as before
    assert json.loads(RunState().to_json())["commit_entry_ids"] == [] and RunState.parse(RunState().to_json())[1] == CommitIds()


def test_commit_ids_join_in_order_and_say_whether_there_is_anything_to_settle():
    first, later = CommitIds(("a",), ("1-0",)), CommitIds((), ("2-0", "2-1"))
    assert first + later == CommitIds(("a",), ("1-0", "2-0", "2-1"))
    assert not CommitIds() and first and later
