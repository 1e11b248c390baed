"""The elastic drill (issue 30) on the real fleet: hf engine, tiny model, real learner, reward service and Redis.
The pool goes 1 -> 2 -> 1 mid-run: the joiner's first weights come from its peer (not the learner) and it is on
the learner's version within 2 publishes; the drained replica finishes what it holds (0 handed back, so nothing
regenerated). Every prompt trained exactly once, nothing lost, nothing dead-lettered, every reward true."""

import json

import pytest

from deploy.local import drills
from deploy.local.sort_task import prepare_run

pytestmark = [pytest.mark.process, pytest.mark.slow]


def test_the_pool_grows_and_shrinks_mid_run_without_loss(tmp_path, monkeypatch):
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
    assert any("from peer" in n for n in res.notes) and any("0 handed back" in n for n in res.notes), res.notes
    assert res.wall_s < res.bound_s
