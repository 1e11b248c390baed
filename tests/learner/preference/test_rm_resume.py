"""A reward-model run resumes from its checkpoint: the trainer restored from one takes exactly the same next
step (before the fix, RMTrainer loaded trainer/actor as full HF weights, which a sharded checkpoint does not
hold: ``OSError: no file named model.safetensors``, so a second ``fleetrl run`` of an rm spec died at start)."""

from __future__ import annotations

import torch

from deploy.local.sort_prefs import preference_rows
from deploy.local.sort_task import make_splits, write_jsonl
from services.learner.checkpoint import CheckpointManager
from services.learner.preference_data import read_pairs
from tests.learner.helpers import settings


def test_rm_trainer_resumes_a_sharded_checkpoint(tiny_model_dir, tmp_path):
    from services.learner.training.rm_trainer import RMTrainer

    train, _ = make_splits(0, 16)
    write_jsonl(preference_rows(train[:16], 0), tmp_path / "prefs.jsonl")
    s = settings(tiny_model_dir, tmp_path, data={"path": str(tmp_path / "prefs.jsonl"), "input_key": "prompt"},
                 algorithm={"name": "rm", "batch_size": 8}, train={"micro_batch_size": 8, "torch_threads": 1})
    pairs = read_pairs(str(tmp_path / "prefs.jsonl"), s.data)
    a = RMTrainer(s, total_steps=2)
    a.train_step(pairs[:8])
    path = CheckpointManager(tmp_path / "ck").save(a.global_step, lambda d: a.save(d / "trainer"))
    metrics_a = a.train_step(pairs[8:])

    b = RMTrainer(s, total_steps=2, resume_dir=path / "trainer")
    assert b.global_step == 1
    metrics_b = b.train_step(pairs[8:])
    assert metrics_a["loss"] == metrics_b["loss"]
    for (name, pa), pb in zip(a.actor.model.state_dict().items(), b.actor.model.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
