"""SFT honours the settings RL reads (data.epochs, train.max_steps) and says how many steps it takes and why."""

from __future__ import annotations

import pytest

from services.learner.algorithms.algorithm_settings import SFTSettings
from services.learner.data import CYCLE
from services.learner.settings import DataSettings
from services.learner.sft.plan import SFTPlanError, sft_plan

SFT = SFTSettings(batch_size=8)


def test_data_epochs_is_honoured():
    plan = sft_plan(DataSettings(path="x", epochs=3), SFT, None, False, 240)
    assert (plan.epochs, plan.total_steps) == (3, 90)
    assert plan.note == "sft: 90 steps: data.epochs 3 x (240 pairs / algorithm.batch_size 8 = 30 steps a pass)"


def test_max_steps_beyond_one_pass_cycles_the_data_as_rl_does_and_says_so():
    for max_steps, was_set, sft in ((60, True, SFT), (None, False, SFTSettings(batch_size=8, max_steps=60))):
        plan = sft_plan(DataSettings(path="x"), sft, max_steps, was_set, 240)
        assert (plan.epochs, plan.total_steps) == (CYCLE, 60)  # was cut to 30 without a word
        assert plan.note.startswith("sft: 60 steps (") and "2.0 passes over the data" in plan.note


def test_epochs_set_cap_max_steps_and_the_note_says_where_the_run_stops():
    plan = sft_plan(DataSettings(path="x", epochs=1), SFT, 60, True, 240)
    assert plan.total_steps == 30
    assert "train.max_steps 60 is more than the data holds" in plan.note and "stops at step 30" in plan.note


def test_two_names_of_one_setting_with_different_values_are_refused_naming_both():
    with pytest.raises(SFTPlanError, match="^data.epochs 3 and algorithm.epochs 2 both set the passes"):
        sft_plan(DataSettings(path="x", epochs=3), SFTSettings(epochs=2), None, False, 10)
    with pytest.raises(SFTPlanError, match="^train.max_steps 5 and algorithm.max_steps 7 both set the steps"):
        sft_plan(DataSettings(path="x"), SFTSettings(max_steps=7), 5, True, 10)
    assert sft_plan(DataSettings(path="x"), SFTSettings(epochs=2), None, False, 16).total_steps == 4  # the old name


def test_the_refusal_of_two_names_says_how_to_keep_the_value_asked_for():
    """`fleetrl run sft.yaml --set train.max_steps=10` on a spec with algorithm.max_steps 40 was told "set only
    train.max_steps", which the user had done: the line gives both ways out, with the value they asked for."""
    with pytest.raises(SFTPlanError) as err:
        sft_plan(DataSettings(path="x"), SFTSettings(max_steps=40), 10, True, 100)
    assert str(err.value) == ("train.max_steps 10 and algorithm.max_steps 40 both set the steps of an sft run (two "
                              "names of one setting): keep one: remove algorithm.max_steps and keep train.max_steps "
                              "10, or set algorithm.max_steps to 10 instead of train.max_steps")
    with pytest.raises(SFTPlanError, match="remove algorithm.epochs and keep data.epochs 3, or set algorithm.epochs "
                                           "to 3 instead of data.epochs$"):
        sft_plan(DataSettings(path="x", epochs=3), SFTSettings(epochs=2), None, False, 10)


async def test_an_sft_learner_takes_data_epochs_and_train_max_steps(tiny_model_dir, tmp_path, redis_server):
    """The learner itself (not only fleetrl run): data.epochs 2 over 6 pairs of 4 is 4 steps (it took 2: the
    setting was accepted and ignored); train.max_steps 5 with no passes set cycles the data to step 5."""
    import json

    from services.learner.service import LearnerService
    from tests.learner.helpers import settings
    from tests.learner.rl.test_runner import run_to_end

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"input": f"{i}+{i}=", "output": str(2 * i)}) + "\n" for i in range(6)))
    for n, (data, train, steps) in enumerate((({"epochs": 2}, {}, 4), ({}, {"max_steps": 5}, 5))):
        s = settings(tiny_model_dir, tmp_path / str(n), algorithm={"name": "sft", "batch_size": 4},
                     data={"path": str(path), **data}, train={"micro_batch_size": 4, **train}, exit_when_done=False,
                     observability={"progress_bar": False})
        status = await run_to_end(LearnerService(s))
        assert status["phase"] == "finished" and (status["step"], status["total_steps"]) == (steps, steps), status
