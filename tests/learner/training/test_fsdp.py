"""The fsdp backend: two FSDP2 ranks (real processes, gloo) train what one ``torch`` rank trains, and publish the
same weights from their shards.

Both runs are real :class:`RLTrainer` instances on the same step batches and seed (``multirank_worker.py``); the
2-rank run shards each step's groups the way the multi-rank learner does, including a step of three groups
(two micro-batches on rank 0, one on rank 1) and a step of one group (rank 1's shard is empty): the ranks
keep in step with idle passes. Float summation order differs (reduce-scatter vs one rank's accumulation), so
equality is within 1e-5 relative, not bitwise.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from shared.ports import free_port
from tests.procs import spawn

STEPS = [2, 3, 1, 2, 2]  # groups per step: even, uneven (2 + 1 micro-batches), one rank empty, even, even
BUCKET = 64 * 1024
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _spec(tmp_path: Path, name: str, model: Path, backend: str, algorithm: dict, publish: dict | None = None,
          checkpoint: bool = False) -> Path:
    out = tmp_path / name
    out.mkdir()
    spec = {"out": str(out), "model": str(model), "steps": STEPS, "checkpoint": checkpoint,
            "settings": {"algorithm": algorithm, "backend": {"name": backend}}}
    if publish:
        spec["publish"] = publish
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def _run_ranks(tmp_path: Path, spec: Path, world: int, env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    master = free_port()
    return [spawn(["-m", "tests.learner.training.multirank_worker", str(spec)], tmp_path / f"{spec.stem}{r}.log",
                  {**ENV, **(env or {}), "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(master)})
            for r in range(world)]


def _wait(tmp_path: Path, procs: list[subprocess.Popen], stem: str, timeout: float = 540) -> None:
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = [(tmp_path / f"{stem}{r}.log").read_text()[-3000:] for r in range(len(procs))]
    assert codes == [0] * len(procs), logs


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def _train_both(tmp_path: Path, model: Path, algorithm: dict, publish: dict | None = None) -> tuple[dict, dict, dict,
                                                                                                 dict]:
    from safetensors.torch import load_file

    one = _spec(tmp_path, "one", model, "torch", algorithm)
    two = _spec(tmp_path, "two", model, "fsdp", algorithm, publish, checkpoint=True)
    procs = _run_ranks(tmp_path, two, 2) + _run_ranks(tmp_path, one, 1)
    _wait(tmp_path, procs[:2], "two")
    _wait(tmp_path, procs[2:], "one")
    results = [json.loads((tmp_path / n / "result.json").read_text()) for n in ("one", "two")]
    weights = [load_file(str(tmp_path / n / "weights.safetensors")) for n in ("one", "two")]
    return results[0], results[1], weights[0], weights[1]


def _assert_same_training(r1: dict, r2: dict, w1: dict, w2: dict, model: Path, keys: tuple[str, ...]) -> None:
    from safetensors.torch import load_file

    assert (r1["backend"], r2["backend"]) == ("torch", "fsdp")
    assert r1["optimizer_steps"] == r2["optimizer_steps"] == len(STEPS)
    for s1, s2 in zip(r1["steps"], r2["steps"], strict=True):
        for key in keys:
            assert s1[key] != 0.0 and _rel(s1[key], s2[key]) <= 1e-5, (key, s1, s2)
    assert w1.keys() == w2.keys()
    base = load_file(str(model / "model.safetensors"))
    moved = max(float((w1[k] - base[k]).abs().max()) for k in base)
    assert moved > 1e-3  # training did change the weights
    for k, a in w1.items():
        diff = (a - w2[k]).float()
        assert float(diff.norm() / a.float().norm()) <= 1e-5, k  # relative, per tensor
        assert float(diff.abs().max()) <= 1e-5, k
    # the fsdp run's checkpoint (DCP: each rank wrote its shards) resumes exactly; the export read from it is the model
    resume = r2["resume"]
    assert resume["sharded_checkpoint"]
    assert resume["global_step"] == resume["optimizer_steps"] == len(STEPS) + 1
    assert resume["max_diff"] == 0.0  # one more step from the checkpoint == one more step without stopping
    assert resume["exported"] >= len(w2) - 1 and resume["export_max_diff"] == 0.0


@pytest.mark.process
@pytest.mark.timeout(600)
def test_two_fsdp_ranks_train_as_one_torch_rank_and_publish_from_shards(tmp_path, tiny_model_dir, redis_server):
    """GRPO with a KL loss (the reference is sharded too): loss, gradient norm and weights after 5 optimizer steps
    equal within 1e-5 relative; then rank 0 publishes from the shards, gathering bucket by bucket, and the
    version's digests equal those of the same weights published from an unsharded model."""
    algorithm = {"name": "grpo", "kl": {"coef": 0.05, "placement": "loss", "estimator": "k3"}}
    publish = {"redis_url": redis_server.url, "run": "fsdp-pub", "bucket_bytes": BUCKET}
    r1, r2, w1, w2 = _train_both(tmp_path, tiny_model_dir, algorithm, publish)
    _assert_same_training(r1, r2, w1, w2, tiny_model_dir, ("loss", "grad_norm"))

    sharded, plain = r2["publish"], r2["publish_unsharded"]
    assert sharded["buckets"] == plain["buckets"] > 2
    assert sharded["checksums"] == plain["checksums"]  # the same bytes, bucket by bucket
    # rank 0 gathered each tensor once (tied embeddings once), one tensor at a time: the extra memory of a
    # bucket's gather is one tensor, at most the bucket (or a tensor bigger than a bucket: its own bucket)
    params = sum(t.numel() * t.element_size() for t in w2.values()) - w2["lm_head.weight"].nbytes
    assert sharded["gathered_bytes"] == params
    assert sharded["peak_gather_bytes"] == max(t.nbytes for t in w2.values())


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(600)
def test_two_fsdp_ranks_train_ppo_with_critic_as_one_torch_rank(tmp_path, tiny_model_dir):
    """PPO: the critic is trained sharded and the reference forward-only sharded, in step with the actor."""
    r1, r2, w1, w2 = _train_both(tmp_path, tiny_model_dir, {"name": "ppo"})
    _assert_same_training(r1, r2, w1, w2, tiny_model_dir, ("grad_norm", "critic_grad_norm"))
    assert r2["resume"]["checkpoint_engines"] == ["actor", "critic"]  # the critic's shards and optimizer state too
    for s1, s2 in zip(r1["steps"], r2["steps"]):  # the policy loss nears 0 by step 5: absolute there
        assert abs(s1["loss"] - s2["loss"]) <= 1e-5 * max(1.0, abs(s1["loss"]))

