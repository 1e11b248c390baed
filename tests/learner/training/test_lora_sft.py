"""LoRA on CPU (trains adapters only, saves adapters and merged weights) and SFT (loss on answers only)."""

import logging

import torch
from transformers import AutoModelForCausalLM

from services.learner.checkpoint import CheckpointManager
from services.learner.training.rl_trainer import RLTrainer
from services.learner.training.sft_trainer import SFTTrainer
from tests.learner.helpers import GOOD, good_bad_batch, response_logprob, settings


def test_lora_trains_adapters_and_exports_merged_weights(tiny_model_dir, tmp_path, caplog):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "grpo"},
                 model={"lora": {"rank": 4, "alpha": 8}}, optim={"actor_lr": 1e-2})
    with caplog.at_level(logging.INFO, logger="services.learner.training.models"):
        trainer = RLTrainer(s, total_steps=3)
    model = trainer.actor.model
    # the learner says at start that LoRA is on and how many parameters train (issue 41)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    assert f"LoRA on: rank 4, alpha 8, target all-linear: {n_train:,} of {n_all:,} parameters train (" in caplog.text
    base = {k: v.clone() for k, v in model.named_parameters() if not v.requires_grad}
    good0 = response_logprob(trainer, [GOOD] * 3)
    for step in range(3):
        trainer.train_step(good_bad_batch(step))
    assert response_logprob(trainer, [GOOD] * 3) > good0 + 0.5
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(torch.equal(base[k], v) for k, v in model.named_parameters() if k in base)

    ckpt = CheckpointManager(tmp_path / "ck").save(3, lambda d: trainer.save(d / "trainer"))
    from safetensors import safe_open

    stored = set()  # the sharded checkpoint holds the adapters and their Adam moments, not the frozen base
    for shard in (ckpt / "trainer" / "state").glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            stored |= set(f.keys())
    # (the tiny model ties lm_head to the frozen embeddings, and torch lists the tied name as a parameter of its own)
    weights = {k for k in stored if k.startswith("actor.model.") and not k.endswith("lm_head.weight")}
    assert weights and all("lora_" in k for k in weights), sorted(weights)[:5]
    assert any(k.endswith(".exp_avg") and "lora_" in k for k in stored)
    export = tmp_path / "export"
    trainer.export(export)
    merged = AutoModelForCausalLM.from_pretrained(export)
    with safe_open(str(export / "model.safetensors"), "pt") as f:  # a plain checkpoint: base names only
        names = f.keys()  # safe_open has keys(), not iteration
        assert not [k for k in names if "lora" in k or "base_layer" in k or k.startswith("base_model")]
    ids = torch.tensor([[1, 10, 20, 30, GOOD, GOOD]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-4)
    # publishing sends the adapter (an adapter round: lora_A / lora_B per adapted module, base-model module names),
    # and the merged model under plain parameter names for a fleet with a replica that cannot load adapters
    pub = trainer.policy_weights()
    adapted = [m.name for m in pub.info.modules]
    assert [n for n, _ in pub.tensors] == [f"{m}.{ab}" for m in adapted for ab in ("lora_A", "lora_B")]
    assert adapted and all(f"{m}.weight" in merged.state_dict() for m in adapted)
    names = set(pub.merged())
    assert names == set(merged.state_dict()) and not any("lora" in n for n in names)

    # fleetrl export of the sharded checkpoint: the base from model.actor, the adapters from the shards, merged
    from services.learner.training.export_checkpoint import export_checkpoint

    from_ckpt = AutoModelForCausalLM.from_pretrained(export_checkpoint(ckpt / "trainer", tmp_path / "from_ckpt"))
    with torch.no_grad():
        assert torch.allclose(from_ckpt(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-6)

    resumed = RLTrainer(s, total_steps=3, resume_dir=ckpt / "trainer")
    assert abs(response_logprob(resumed, [GOOD] * 3) - response_logprob(trainer, [GOOD] * 3)) < 1e-5


def test_sft_learns_the_answer_not_the_prompt(tiny_model_dir, tmp_path):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "sft", "batch_size": 4}, optim={"actor_lr": 3e-3})
    trainer = SFTTrainer(s, total_steps=8)
    prompt, answer = [1, 50, 51, 52], [GOOD, GOOD, 2]
    before_answer = response_logprob(trainer, answer, prompt=prompt)
    # the loss is the mean NLL of the 3 answer tokens only (prompt tokens carry none)
    expected_first_loss = -before_answer / len(answer)
    losses = [trainer.train_step([(prompt, answer)] * 4)["sft_loss"] for _ in range(8)]
    assert abs(losses[0] - expected_first_loss) < 1e-4
    assert losses[-1] < losses[0] / 2
    assert response_logprob(trainer, answer, prompt=prompt) > before_answer + 3.0


def test_lora_merge_for_publishing_copies_nothing_and_matches_peft(tiny_model_dir, tmp_path):
    import copy

    from services.learner.training.models import merged_state_dict

    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "grpo"},
                 model={"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "gate_proj"]}})
    model = RLTrainer(s, total_steps=1).actor.model
    with torch.no_grad():  # adapters as after some training (lora_B starts at zero)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(generator=torch.Generator().manual_seed(len(n)))
    inner = model.get_base_model()  # the HF model with LoRA layers injected: keys without peft's prefix
    before = {k: v.clone() for k, v in inner.state_dict().items()}
    got = merged_state_dict(model)
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)  # bit for bit what peft's merge gives
    assert any(not torch.equal(got[k], before[k.replace("q_proj.", "q_proj.base_layer.")])
               for k in got if "q_proj.weight" in k)
    # the actor is untouched, and tensors LoRA does not adapt are the actor's own memory, not copies
    assert all(torch.equal(v, before[k]) for k, v in inner.state_dict().items())
    own = {t.data_ptr() for t in inner.state_dict().values()}
    shared = [k for k in got if "k_proj" in k or "norm" in k]
    assert shared and all(got[k].data_ptr() in own for k in shared)
