"""train.torch_threads_max: the learner's threads follow the machine's idle cores (shared/service_kit/idle_cores.py)
through hooks on every model and optimizer the trainer builds."""

import pytest
from pydantic import ValidationError

from services.learner.training.rl_trainer import RLTrainer
from tests.learner.helpers import good_bad_batch, settings


def test_every_model_and_optimizer_of_the_step_adjusts_the_threads(tiny_model_dir, tmp_path, monkeypatch):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "ppo", "kl": {"coef": 0.01}},
                 train={"groups_per_step": 2, "torch_threads": 1, "torch_threads_max": 2})
    trainer = RLTrainer(s, total_steps=2)
    assert trainer.idle_cores is not None and (trainer.idle_cores.floor, trainer.idle_cores.cap) == (1, 2)
    calls = []
    monkeypatch.setattr(trainer.idle_cores, "adjust", lambda: calls.append(1) or 1)
    trainer.train_step(good_bad_batch(0))
    # PPO with a reference: forwards of the actor, the reference and the critic, the backward of each trained
    # model, and both optimizer steps
    assert len(calls) >= 7, len(calls)


def test_without_the_setting_nothing_is_hooked(tiny_model_dir, tmp_path):
    trainer = RLTrainer(settings(tiny_model_dir, tmp_path, train={"groups_per_step": 2}), total_steps=1)
    assert trainer.idle_cores is None


def test_a_cap_below_the_floor_is_refused_naming_both(tiny_model_dir, tmp_path):
    with pytest.raises(ValidationError, match="train.torch_threads_max .1. is below train.torch_threads .2."):
        settings(tiny_model_dir, tmp_path, train={"torch_threads": 2, "torch_threads_max": 1})
