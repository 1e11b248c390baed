"""``fleetrl export``: a (sharded) checkpoint's policy as a plain Hugging Face directory that loads as is."""

import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from deploy.cli import app
from services.learner.checkpoint import CheckpointManager
from services.learner.training.rl_trainer import RLTrainer
from tests.learner.helpers import good_bad_batch, settings


def test_export_of_a_sharded_checkpoint_is_the_trained_policy(tiny_model_dir, tmp_path):
    trainer = RLTrainer(settings(tiny_model_dir, tmp_path, optim={"actor_lr": 1e-2}), total_steps=2)
    trainer.train_step(good_bad_batch(0))
    CheckpointManager(tmp_path / "run" / "checkpoints").save(1, lambda d: trainer.save(d / "trainer"))

    result = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    assert "exported step 1" in result.output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "tokenizer_config.json").is_file()
    trained = dict(trainer.actor.model.named_parameters())
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    for name, p in exported.named_parameters():
        assert torch.equal(p, trained[name]), name
    assert any(not torch.equal(p, base[n]) for n, p in exported.named_parameters())  # the trained weights
    ids = torch.tensor([[1, 10, 20, 30]])
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, trainer.actor.model(input_ids=ids).logits)


def test_export_without_a_checkpoint_says_so_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "no complete checkpoint found" in result.output
