"""Two drills of `make drills` on the real fleet (the others run in `make drills`): the learner SIGKILLed
twice between checkpoints, and Redis SIGKILLed and restarted on its AOF. Every prompt trained exactly once,
nothing dead-lettered, every reward true, no hang."""

import json

import pytest

from deploy.local import drills
from deploy.local.sort_task import prepare_run

pytestmark = pytest.mark.process  # the whole fleet as processes


@pytest.fixture(scope="module")
def drill_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("drills")
    _, _, model = prepare_run(root, seed=0, heldout=drills.PROMPTS, hidden_size=64, layers=2)
    rows = [json.loads(x) for x in (root / "data" / "heldout.jsonl").read_text().splitlines()]
    return root, model, rows


@pytest.mark.slow
@pytest.mark.parametrize("name", ["learner-double-kill", "redis-restart"])
def test_drill_accounts_for_every_prompt(drill_setup, name, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    root, model, rows = drill_setup
    res = drills.run_drill(drills.DRILLS[name], root, model, rows)
    a = res.accounting
    assert res.error is None, (res.error, res.notes)
    assert a is not None and a.ok, (a, res.notes)
    assert a.trained_once == drills.PROMPTS and a.rewards_checked == drills.PROMPTS * drills.GROUP_SIZE
    assert len(res.notes) >= 1 and res.wall_s < res.bound_s
