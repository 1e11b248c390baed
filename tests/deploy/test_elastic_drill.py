"""The elastic drill (issue 30) on the real fleet: hf engine, tiny model, real learner, reward service and Redis.
``fleetrl run``'s controller (deploy/run/autoscale.py) drives the pool 1 -> 3 -> 1 from the learner's demand signal
(a slow verifier on the first prompts starves the learner; the rest are scored at once). Each joiner's first
weights come from a peer (not the learner) and it is on the learner's version within 2 publishes; each drained
replica finishes what it holds (0 handed back, so nothing regenerated); the learner's bytes per version stay those
of a fixed pool. Every prompt trained exactly once, nothing lost, nothing dead-lettered, every reward true."""

import json

import pytest

from deploy.local import drills
from deploy.local.sort_task import prepare_run

pytestmark = [pytest.mark.process, pytest.mark.slow]


def test_the_controller_takes_the_pool_1_3_1_mid_run_without_loss(tmp_path, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    drill = drills.DRILLS["elastic"]
    _, _, model = prepare_run(tmp_path, seed=0, heldout=drill.prompts, hidden_size=64, layers=2)
    rows = [json.loads(x) for x in (tmp_path / "data" / "heldout.jsonl").read_text().splitlines()]
    assert len(rows) == drill.prompts
    res = drills.run_drill(drill, tmp_path, model, rows)
    a = res.accounting
    assert res.error is None, (res.error, res.notes)
    assert a is not None and a.ok, (a, res.notes)
    assert a.trained_once == drill.prompts and a.trained_twice == 0 and a.lost == 0 and a.dead_lettered == 0
    assert a.rewards_wrong == 0 and a.rewards_checked == drill.prompts * drills.GROUP_SIZE
    notes = "\n".join(res.notes)
    joins, drains = notes.count(" joined with "), notes.count(" drained: ")
    assert joins >= 2 and drains >= 2 and "pool sizes: 1 -> 3 -> " in notes and "no catch-up round" in notes, notes
    assert notes.count("from peer") == joins and notes.count("level with the learner") == joins, notes
    assert notes.count(" 0 handed back") == drains, notes
    assert res.wall_s < res.bound_s
