"""``train.max_steps`` and ``data.epochs``: max_steps with epochs unset cycles the prompts (as Hugging Face's
max_steps overrides num_train_epochs); epochs set caps the run, and a cap that cuts it short is said at start
(the learner's log, fleetrl run's display) instead of the run stopping early without a word."""

from __future__ import annotations

import logging

from services.learner.data import CYCLE, epoch_plan
from services.learner.settings import DataSettings
from tests.learner.rl.test_runner import (
    N_PROMPTS,
    learner_settings,
    prompts_file,
    run_with_fleet,
    trained_items,
)

__all__ = ["prompts_file"]  # the fixture, used by name


def test_max_steps_past_the_data_cycles_it_when_epochs_is_unset():
    plan = epoch_plan(DataSettings(path="d.jsonl"), groups_per_step=8, max_steps=300, rows=2000)
    assert plan.epochs == CYCLE
    assert plan.note.startswith("data: train.max_steps 300 x train.groups_per_step 8 = 2400 prompts from 2000: "
                                "the prompts are cycled (1.2 passes")
    assert epoch_plan(DataSettings(path="d.jsonl"), 8, 200, 2000).note is None  # fits in one pass: nothing to say
    assert epoch_plan(DataSettings(path="d.jsonl"), 8, None, 2000).epochs == 1  # no max_steps: one pass, as before


def test_epochs_set_caps_the_run_and_says_where_it_stops():
    plan = epoch_plan(DataSettings(path="d.jsonl", epochs=1), groups_per_step=8, max_steps=300, rows=2000)
    assert plan.epochs == 1
    assert plan.note == ("data: train.max_steps 300 is more than the data holds: data.epochs 1 x 2000 prompts / "
                         "train.groups_per_step 8 = 250 steps, so the run stops at step 250; raise data.epochs, or "
                         "leave it unset to cycle the prompts until max_steps")
    assert epoch_plan(DataSettings(path="d.jsonl", epochs=2), 8, 300, 2000).note is None


async def test_a_run_longer_than_its_prompt_set_trains_to_max_steps(tiny_model_dir, tmp_path, redis_server,
                                                                      redis_client, prompts_file, caplog):
    s = learner_settings(tiny_model_dir, tmp_path, redis_server, train={"max_steps": 6})  # 8 prompts, 2 per step
    with caplog.at_level(logging.WARNING, logger="services.learner.rl.runner"):
        status, _, _ = await run_with_fleet(s, redis_client)
    assert status["phase"] == "finished", status
    assert status["step"] == status["total_steps"] == 6
    items = trained_items(tmp_path / "run")
    assert sum(items.values()) == 6 * 2 * 4 and {k.split("-")[0] for k in items} == {"e0", "e1"}
    assert all(items[f"e0-{i}"] == 4 for i in range(N_PROMPTS))  # the first pass whole, then the second begins
    assert any("the prompts are cycled (1.5 passes" in r.getMessage() for r in caplog.records)
