"""DeepSpeed backend: the config mapping (CPU) and real ZeRO training (GPU only)."""

import importlib.util
import os

import pytest

from services.learner.settings import DeepSpeedBackendSettings, OptimSettings
from services.learner.training.backends.deepspeed_engine import deepspeed_config


def test_deepspeed_config_from_settings():
    cfg = deepspeed_config(DeepSpeedBackendSettings(zero_stage=3, adam_offload=True, param_offload=True),
                           OptimSettings(max_grad_norm=0.5, weight_decay=0.01), accumulation=4)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "cpu" and zero["stage3_gather_16bit_weights_on_model_save"]
    assert cfg["gradient_accumulation_steps"] == 4 and cfg["gradient_clipping"] == 0.5
    assert cfg["optimizer"]["params"]["weight_decay"] == 0.01 and cfg["bf16"]["enabled"]
    cfg2 = deepspeed_config(DeepSpeedBackendSettings(zero_stage=2), OptimSettings(), accumulation=1)
    assert "offload_optimizer" not in cfg2["zero_optimization"] and "offload_param" not in cfg2["zero_optimization"]


@pytest.mark.gpu
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_trains_and_checkpoints(stage, tiny_model_dir, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("deepspeed") is None or not torch.cuda.is_available():
        pytest.skip("needs deepspeed and a CUDA GPU")
    from services.learner.checkpoint import CheckpointManager
    from services.learner.training.rl_trainer import RLTrainer
    from shared.ports import free_port
    from tests.learner.helpers import GOOD, good_bad_batch, response_logprob, settings

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, os.environ.get(k, v))
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "grpo"}, model={"device": "cuda", "dtype": "bfloat16",
                 "gradient_checkpointing": True},
                 backend={"name": "deepspeed", "zero_stage": stage, "adam_offload": stage == 3},
                 train={"micro_batch_size": 4})
    trainer = RLTrainer(s, total_steps=4)
    good0 = response_logprob(trainer, [GOOD] * 3)
    for step in range(4):
        trainer.train_step(good_bad_batch(step))
    assert response_logprob(trainer, [GOOD] * 3) > good0 + 0.5
    path = CheckpointManager(tmp_path / "ck").save(4, lambda d: trainer.save(d / "trainer"))
    assert (path / "trainer" / "actor" / "config.json").is_file()


@pytest.mark.gpu
def test_zero3_policy_weights_are_gathered_in_full(tiny_model_dir, tmp_path, monkeypatch):
    """ZeRO-3 partitions parameters; publishing goes through GatheredParameters and gives full tensors."""
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("deepspeed") is None or not torch.cuda.is_available():
        pytest.skip("needs deepspeed and a CUDA GPU")
    from safetensors.torch import load_file

    from services.learner.training.rl_trainer import RLTrainer
    from shared.ports import free_port
    from tests.learner.helpers import good_bad_batch, settings

    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, os.environ.get(k, v))
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "grpo"}, model={"device": "cuda", "dtype": "bfloat16"},
                 backend={"name": "deepspeed", "zero_stage": 3}, train={"micro_batch_size": 4})
    trainer = RLTrainer(s, total_steps=2)
    trainer.train_step(good_bad_batch(0))
    weights = trainer.policy_weights()
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    for name, tensor in base.items():
        if name in weights:
            assert tuple(weights[name].shape) == tuple(tensor.shape), name
            assert weights[name].device.type == "cpu"
    assert any(not torch.equal(weights[n].float(), base[n].float()) for n in base if n in weights)
