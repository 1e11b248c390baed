"""Backend choice and precision without a process group: what ``auto`` resolves to, which dtype a model is
loaded and computed in, which modules FSDP shards, and the settings that refuse what cannot work."""

import pytest
import torch
from pydantic import ValidationError

from services.learner.training.backends.factory import resolve_backend
from services.learner.training.lockstep import extra_passes
from services.learner.training.precision import Precision, resolve_precision
from tests.learner.helpers import settings


def test_dtype_auto_is_the_default_and_means_bf16_mixed_on_cuda_fp32_on_cpu(tiny_model_dir, tmp_path):
    assert settings(tiny_model_dir, tmp_path).model.dtype == "auto"
    assert resolve_precision("auto", torch.device("cpu")) == Precision(torch.float32, None)
    cuda = resolve_precision("auto", torch.device("cuda", 0))
    assert cuda == Precision(torch.float32, torch.bfloat16) and cuda.mixed  # fp32 master weights, bf16 compute
    assert resolve_precision("bfloat16", torch.device("cuda", 0)) == Precision(torch.bfloat16, None)


def test_auto_backend_is_torch_on_one_rank(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path)
    assert s.backend.name == "auto"
    assert resolve_backend(s.backend).name == "torch"  # no process group here: one rank
    assert resolve_backend(settings(tiny_model_dir, tmp_path, backend={"name": "fsdp"}).backend).name == "fsdp"
    assert extra_passes(3, lockstep=True) == 0  # one rank: nothing to keep in step with


def test_auto_backend_is_fsdp_on_several_ranks_unless_lora(monkeypatch, tiny_model_dir, tmp_path):
    from services.learner.training.backends import factory

    monkeypatch.setattr(factory, "active", lambda: True)
    s = settings(tiny_model_dir, tmp_path)
    assert factory.resolve_backend(s.backend).name == "fsdp"
    assert factory.resolve_backend(s.backend, lora=True).name == "torch"


def test_fsdp_units_are_the_decoder_layers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from services.learner.training.backends.fsdp_engine import decoder_layers

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    layers = decoder_layers(model)
    assert layers == list(model.model.layers) and len(layers) == model.config.num_hidden_layers


@pytest.mark.parametrize(("sections", "needle"), [
    ({"backend": {"name": "fsdp"}, "model": {"lora": {"rank": 4}}}, "model.lora with backend fsdp"),
    ({"backend": {"name": "fsdp", "zero_stage": 3}}, "zero_stage"),
])
def test_settings_refuse_what_a_backend_cannot_do(tiny_model_dir, tmp_path, sections, needle):
    with pytest.raises(ValidationError, match=needle):
        settings(tiny_model_dir, tmp_path, **sections)


def test_fsdp_takes_micro_batch_tokens(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, backend={"name": "fsdp", "activation_checkpointing": True},
                 train={"micro_batch_tokens": 64})
    assert s.backend.name == "fsdp" and s.train.micro_batch_tokens == 64
