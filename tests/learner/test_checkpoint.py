"""Checkpoints: atomic layout, and a trainer restored from one takes exactly the same next step."""

import torch

from services.learner.checkpoint import CheckpointManager
from services.learner.training.rl_trainer import RLTrainer
from tests.learner.helpers import good_bad_batch, settings


def test_manager_atomic_latest_and_prune(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep=2)
    assert mgr.latest() is None
    for step in (1, 2, 3):
        mgr.save(step, lambda d, s=step: (d / "x.txt").write_text(str(s)))
    assert [p.name for p in mgr.complete()] == ["step-00000002", "step-00000003"]
    assert (mgr.latest() / "x.txt").read_text() == "3"
    # a write that fails leaves no trace and the previous latest stands
    def boom(d):
        (d / "partial").write_text("half")
        raise RuntimeError("disk full")
    try:
        mgr.save(4, boom)
    except RuntimeError:
        pass
    assert mgr.latest().name == "step-00000003" and not list((tmp_path / "ck").glob(".tmp-*"))
    # a crash mid-write (temp dir left behind) is cleaned at the next start
    (tmp_path / "ck" / ".tmp-step-00000005-dead").mkdir()
    mgr = CheckpointManager(tmp_path / "ck", keep=2)
    assert not list((tmp_path / "ck").glob(".tmp-*")) and mgr.latest().name == "step-00000003"
    # saving the same step again replaces it
    mgr.save(3, lambda d: (d / "x.txt").write_text("3b"))
    assert (mgr.latest() / "x.txt").read_text() == "3b"


def test_resume_takes_the_identical_next_step(tiny_model_dir, tmp_path):
    # PPO covers the most state: actor + critic + their optimizers, reward running stats, shuffling RNG.
    s = settings(tiny_model_dir, tmp_path,
                 algorithm={"name": "ppo", "ppo_epochs": 2, "normalize_rewards": True, "kl": {"coef": 0.05}},
                 train={"mini_batch_size": 4, "micro_batch_size": 2},
                 optim={"schedule": "cosine", "warmup_ratio": 0.3})
    a = RLTrainer(s, total_steps=4)
    a.train_step(good_bad_batch(0))
    mgr = CheckpointManager(tmp_path / "ck")
    path = mgr.save(a.global_step, lambda d: a.save(d / "trainer"))
    metrics_a = a.train_step(good_bad_batch(1))

    b = RLTrainer(s, total_steps=4, resume_dir=path / "trainer")
    assert b.global_step == 1 and b.reward_stats.count == 8  # the 8 rewards of step 1
    metrics_b = b.train_step(good_bad_batch(1))
    for key in ("policy_loss", "value_loss", "actor_grad_norm", "critic_grad_norm", "kl", "actor_lr", "score_mean"):
        assert metrics_a[key] == metrics_b[key], key
    for (name, pa), pb in zip(a.actor.model.state_dict().items(), b.actor.model.state_dict().values()):
        assert torch.equal(pa, pb), name
    for pa, pb in zip(a.critic.model.parameters(), b.critic.model.parameters()):
        assert torch.equal(pa, pb)
    assert b.global_step == 2


def test_an_older_full_weights_checkpoint_still_resumes(tiny_model_dir, tmp_path):
    """Checkpoints written before sharded ones (HF weights in trainer/actor, actor_optim/optimizer.pt) resume."""
    import json

    from services.learner.training.rng import save_rng

    s = settings(tiny_model_dir, tmp_path, optim={"schedule": "cosine", "warmup_ratio": 0.3})
    a = RLTrainer(s, total_steps=4)
    a.train_step(good_bad_batch(0))

    def old_layout(d):  # what TrainerBase.save wrote before the DCP shards
        out = d / "trainer"
        a.actor.model.save_pretrained(out / "actor", safe_serialization=True)
        a.tokenizer.save_pretrained(out / "actor")
        a.actor.save_state(out / "actor_optim")
        save_rng(out / "rng.pt")
        (out / "trainer.json").write_text(json.dumps({"global_step": a.global_step, **a.extra_state()}))

    path = CheckpointManager(tmp_path / "ck").save(1, old_layout)
    metrics_a = a.train_step(good_bad_batch(1))
    b = RLTrainer(s, total_steps=4, resume_dir=path / "trainer")
    metrics_b = b.train_step(good_bad_batch(1))
    assert metrics_a["policy_loss"] == metrics_b["policy_loss"] and metrics_a["actor_lr"] == metrics_b["actor_lr"]
    for (name, pa), pb in zip(a.actor.model.state_dict().items(), b.actor.model.state_dict().values()):
        assert torch.equal(pa, pb), name
