"""DeepSpeed backend: the config mapping, and real ZeRO training on the CPU (DeepSpeed's CPU accelerator over
gloo, fp32): two ZeRO-3 ranks (real processes; GRPO, and PPO with a critic) and one ZeRO-2 rank train what one
``torch`` rank trains, and the ZeRO-3 ranks publish the same weights; on CUDA (GPU only) ZeRO-2/3 in bf16 with
offload.

The CPU test runs the same :class:`RLTrainer` on the same step batches and seed as ``test_fsdp.py``
(``multirank_worker.py``), including uneven shards (a step of three groups: two passes on rank 0, one on rank 1;
a step of one group: rank 1 trains on nothing) that the ranks keep in step with idle passes. Float summation
order differs (reduce-scatter vs one rank's accumulation), so equality is within 1e-5 relative, not bitwise.
Skipped where ``deepspeed`` is not installed (the ``dev`` or ``deepspeed`` extra).
"""

import json
import os
from pathlib import Path

import pytest

from services.learner.settings import DeepSpeedBackendSettings, OptimSettings
from services.learner.training.backends.deepspeed_engine import deepspeed_config, use_bf16
from tests.learner.deepspeed_site import NO_DEEPSPEED, SKIP_REASON, deepspeed_env
from tests.learner.training.test_fsdp import BUCKET, STEPS, _rel, _run_ranks, _wait

needs_deepspeed = pytest.mark.skipif(NO_DEEPSPEED, reason=SKIP_REASON)


def test_deepspeed_config_from_settings():
    cfg = deepspeed_config(DeepSpeedBackendSettings(zero_stage=3, adam_offload=True, param_offload=True),
                           OptimSettings(max_grad_norm=0.5, weight_decay=0.01), bf16=True)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "cpu"
    assert cfg["managed_gradient_accumulation"] is False  # our step() is the update boundary
    assert cfg["gradient_clipping"] == 0.5 and cfg["bf16"]["enabled"]
    params = cfg["optimizer"]["params"]
    assert params["weight_decay"] == 0.01 and params["torch_adam"] is False  # offloaded Adam: DeepSpeedCPUAdam
    cfg2 = deepspeed_config(DeepSpeedBackendSettings(zero_stage=2), OptimSettings(), bf16=False)
    assert "offload_optimizer" not in cfg2["zero_optimization"] and "offload_param" not in cfg2["zero_optimization"]
    assert cfg2["optimizer"]["params"]["torch_adam"] is True and not cfg2["bf16"]["enabled"]


def test_deepspeed_precision_follows_the_device():
    import torch

    from services.learner.training.precision import resolve_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    ds = DeepSpeedBackendSettings()
    assert use_bf16(ds, resolve_precision("auto", cpu), cpu) is False
    assert use_bf16(ds, resolve_precision("auto", cuda), cuda) is True
    assert use_bf16(ds, resolve_precision("float32", cuda), cuda) is False
    with pytest.raises(ValueError, match="on the CPU trains in float32"):
        use_bf16(DeepSpeedBackendSettings(bf16=True), resolve_precision("auto", cpu), cpu)
    with pytest.raises(ValueError, match="adam_offload"):
        use_bf16(DeepSpeedBackendSettings(adam_offload=True), resolve_precision("auto", cpu), cpu)
    with pytest.raises(ValueError, match="float16"):
        use_bf16(ds, resolve_precision("float16", cuda), cuda)


def _spec(tmp_path: Path, name: str, model: Path, backend: dict, algorithm: dict, publish: dict | None = None,
          checkpoint: bool = False) -> Path:
    out = tmp_path / name
    out.mkdir()
    spec = {"out": str(out), "model": str(model), "steps": STEPS, "checkpoint": checkpoint,
            "settings": {"algorithm": algorithm, "backend": backend}}
    if publish:
        spec["publish"] = publish
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(600)
def test_two_zero3_ranks_on_cpu_train_as_one_torch_rank_and_publish(tmp_path, tiny_model_dir, redis_server):
    """GRPO with a KL loss: loss, gradient norm and weights after 5 optimizer steps equal within 1e-5 relative
    (and those of ZeRO-2 on one rank);
    rank 0 publishes the weights gathered from the ZeRO-3 partitions and the version's digests equal those of the
    same weights published from an unsharded model; the DeepSpeed checkpoint (every rank's own files) resumes
    exactly and exports the model."""
    from safetensors.torch import load_file

    algorithm = {"name": "grpo", "kl": {"coef": 0.05, "placement": "loss", "estimator": "k3"}}
    publish = {"redis_url": redis_server.url, "run": "ds-pub", "bucket_bytes": BUCKET}
    one = _spec(tmp_path, "one", tiny_model_dir, {"name": "torch"}, algorithm)
    two = _spec(tmp_path, "two", tiny_model_dir, {"name": "deepspeed", "zero_stage": 3}, algorithm, publish,
                checkpoint=True)
    zero2 = _spec(tmp_path, "zero2", tiny_model_dir, {"name": "deepspeed", "zero_stage": 2}, algorithm)
    ds = deepspeed_env()
    procs = _run_ranks(tmp_path, two, 2, ds) + _run_ranks(tmp_path, one, 1) + _run_ranks(tmp_path, zero2, 1, ds)
    _wait(tmp_path, procs[:2], "two")
    _wait(tmp_path, procs[2:3], "one")
    _wait(tmp_path, procs[3:], "zero2")
    r1, r2, r3 = (json.loads((tmp_path / n / "result.json").read_text()) for n in ("one", "two", "zero2"))
    w1, w2, w3 = (load_file(str(tmp_path / n / "weights.safetensors")) for n in ("one", "two", "zero2"))
    # ZeRO-2 on one rank (a one-rank process group of its own) is the same optimizer over the same gradients
    assert r3["backend"] == "deepspeed" and r3["optimizer_steps"] == len(STEPS)
    for s1, s3 in zip(r1["steps"], r3["steps"], strict=True):
        assert _rel(s1["loss"], s3["loss"]) <= 1e-5 and _rel(s1["grad_norm"], s3["grad_norm"]) <= 1e-5, (s1, s3)
    assert max(float((a - w3[k]).abs().max()) for k, a in w1.items()) <= 1e-5

    assert (r1["backend"], r2["backend"]) == ("torch", "deepspeed")
    assert r1["optimizer_steps"] == r2["optimizer_steps"] == len(STEPS)
    for s1, s2 in zip(r1["steps"], r2["steps"], strict=True):
        for key in ("loss", "grad_norm"):
            assert s1[key] != 0.0 and _rel(s1[key], s2[key]) <= 1e-5, (key, s1, s2)
        assert s1["lr"] == pytest.approx(s2["lr"], rel=1e-12)
    assert w1.keys() == w2.keys()
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert max(float((w1[k] - base[k]).abs().max()) for k in base) > 1e-3  # training did change the weights
    for k, a in w1.items():
        diff = (a - w2[k]).float()
        assert float(diff.norm() / a.float().norm()) <= 1e-5, k  # relative, per tensor
        assert float(diff.abs().max()) <= 1e-5, k

    sharded, plain = r2["publish"], r2["publish_unsharded"]
    assert sharded["buckets"] == plain["buckets"] > 2
    assert sharded["checksums"] == plain["checksums"]  # the same bytes, bucket by bucket (tied weights once)
    assert r2["publish"]["version"] == 1

    resume = r2["resume"]
    assert not resume["sharded_checkpoint"] and resume["checkpoint_engines"] == ["actor_optim"]
    assert resume["global_step"] == resume["optimizer_steps"] == len(STEPS) + 1
    assert resume["max_diff"] == 0.0  # one more step from the checkpoint == one more step without stopping
    assert resume["exported"] >= len(w2) - 1 and resume["export_max_diff"] == 0.0
    ranks_files = sorted(p.name for p in (tmp_path / "two" / "ckpt" / "trainer" / "actor_optim" / "ds").iterdir())
    assert sum("optim_states" in n for n in ranks_files) == 2, ranks_files  # each rank wrote its partition


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(600)
def test_two_zero3_ranks_on_cpu_train_ppo_with_critic_as_one_torch_rank(tmp_path, tiny_model_dir):
    """PPO: the critic is a second DeepSpeed engine in each rank's process, trained in step with the actor; both
    engines' checkpoints resume exactly."""
    from safetensors.torch import load_file

    one = _spec(tmp_path, "one", tiny_model_dir, {"name": "torch"}, {"name": "ppo"})
    two = _spec(tmp_path, "two", tiny_model_dir, {"name": "deepspeed", "zero_stage": 3}, {"name": "ppo"},
                checkpoint=True)
    procs = _run_ranks(tmp_path, two, 2, deepspeed_env()) + _run_ranks(tmp_path, one, 1)
    _wait(tmp_path, procs[:2], "two")
    _wait(tmp_path, procs[2:], "one")
    r1, r2 = (json.loads((tmp_path / n / "result.json").read_text()) for n in ("one", "two"))
    w1, w2 = (load_file(str(tmp_path / n / "weights.safetensors")) for n in ("one", "two"))
    for s1, s2 in zip(r1["steps"], r2["steps"], strict=True):
        for key in ("grad_norm", "critic_grad_norm"):
            assert s1[key] != 0.0 and _rel(s1[key], s2[key]) <= 1e-5, (key, s1, s2)
        assert abs(s1["loss"] - s2["loss"]) <= 1e-5 * max(1.0, abs(s1["loss"]))  # nears 0 by step 5: absolute
    assert max(float((a - w2[k]).abs().max()) for k, a in w1.items()) <= 1e-5
    resume = r2["resume"]
    assert resume["checkpoint_engines"] == ["actor_optim", "critic_optim"] and resume["max_diff"] == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_trains_and_checkpoints(stage, tiny_model_dir, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if NO_DEEPSPEED or not torch.cuda.is_available():
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
    if NO_DEEPSPEED or not torch.cuda.is_available():
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
