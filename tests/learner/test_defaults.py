"""Defaults that differ from what people bring from TRL / Hugging Face are either aligned or said: a linear
schedule exists (HF's default shape), and how many forward/backward passes a step takes is logged at start."""

from __future__ import annotations

import pytest

from services.learner.data import passes_note
from services.learner.settings import OptimSettings
from services.learner.training.backends.base import make_schedule
from tests.learner.helpers import settings


def test_linear_schedule_warms_up_then_falls_in_a_straight_line_to_its_floor():
    f = make_schedule(OptimSettings(schedule="linear", warmup_ratio=0.0, min_lr_ratio=0.0), total_steps=10)
    assert [round(f(s), 6) for s in (0, 5, 10, 20)] == [1.0, 0.5, 0.0, 0.0]  # Hugging Face's linear
    g = make_schedule(OptimSettings(schedule="linear", warmup_ratio=0.2, min_lr_ratio=0.1), total_steps=10)
    assert g(0) < g(1) < 1.0 and g(2) == pytest.approx(1.0) and g(10) == pytest.approx(0.1)
    assert g(6) == pytest.approx(1.0 - 0.9 * 0.5)


def test_optim_total_steps_sets_the_span_of_the_schedule():
    derived = make_schedule(OptimSettings(schedule="linear", warmup_ratio=0.1, min_lr_ratio=0.0), total_steps=100)
    own = make_schedule(OptimSettings(schedule="linear", warmup_ratio=0.1, min_lr_ratio=0.0, total_steps=200),
                        total_steps=100)
    assert derived(10) == 1.0 and derived(100) == 0.0  # warm-up 10, down to the floor at the run's 100 steps
    assert own(10) < 1.0 and own(20) == 1.0  # warm-up 20 (10 % of its 200)
    assert own(100) == pytest.approx(1 - 80 / 180) and own(200) == 0.0  # the floor at 200, not at the run's 100


def test_the_passes_of_a_step_are_said_with_a_hint_when_there_are_many(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, train={"groups_per_step": 16, "micro_batch_size": 4},
                 rollout={"group_size": 4})
    assert passes_note(s).startswith("train: a step of 64 samples (train.groups_per_step 16 x group size 4) is 16 "
                                     "forward/backward passes of train.micro_batch_size 4 (raise")
    big = settings(tiny_model_dir, tmp_path, train={"groups_per_step": 16, "micro_batch_size": 64},
                   rollout={"group_size": 4})
    assert passes_note(big).endswith("is 1 forward/backward pass of train.micro_batch_size 64")
