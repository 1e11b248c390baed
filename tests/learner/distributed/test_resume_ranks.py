"""A run resumes on another number of learner ranks (2 -> 1, 1 -> 2) from a sharded (DCP) checkpoint, at the
right step and with its optimizer state: after 2 + 2 steps its weights, Adam moments and step counts equal those
of an uninterrupted one-rank run of the same 4 steps (float summation order aside: 2 ranks sum their gradients
in another order than one rank does). The 2-rank phases run both multi-rank backends: ``auto`` (``fsdp`` on two
ranks: each holds half of every parameter and Adam moment; one rank is ``torch``) and ``torch`` (replicated)."""

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from shared.ports import free_port
from tests.learner.helpers import good_bad_batch, settings

pytestmark = pytest.mark.process  # the 2-rank phases are two torch.multiprocessing ranks over gloo

TOTAL = 4  # learner steps of the whole run (the cosine schedule spans them)


def _phase(rank: int, world: int, cfg: str, resume: str | None, first: int, steps: int, save_at: int | None,
           save_to: str | None, result: str | None) -> None:
    """One rank of one phase: ``steps`` learner steps from step ``first`` (resumed from ``resume``), a checkpoint
    into ``save_to`` after step ``save_at``, and (rank 0) the weights, Adam state and counters into ``result``."""
    from services.learner.distributed.channel import shard_groups
    from services.learner.settings import LearnerSettings
    from services.learner.training.rl_trainer import RLTrainer

    trainer = RLTrainer(LearnerSettings(**json.loads(cfg)), total_steps=TOTAL,
                        resume_dir=Path(resume) if resume else None)
    assert trainer.global_step == first, (trainer.global_step, first)
    assert trainer.backend.name == _backend(json.loads(cfg)["backend"]["name"], world)
    lrs = []
    for step in range(first, first + steps):
        batch = good_bad_batch(step)
        groups = [batch[i:i + 4] for i in range(0, len(batch), 4)]
        scores = [float(e.reward) for e in batch]
        metrics = trainer.train_step(shard_groups(groups, world)[rank], batch_scores=scores,
                                     batch_samples=len(scores))
        lrs.append(metrics["actor_lr"])
        if save_to and trainer.global_step == save_at:  # rank 0 writes its shards and the rest, the others theirs
            trainer.save(Path(save_to)) if rank == 0 else trainer.save_follower(Path(save_to))
    if result:  # every rank: an fsdp rank's tensors are shards, made whole by a collective
        opt = trainer.actor.optimizer
        names = {id(p): n for n, p in trainer.actor.model.named_parameters()}
        tensors = {f"w.{n}": _full(p.detach()) for n, p in trainer.actor.model.named_parameters()}
        for p, st in opt.state.items():
            tensors[f"m.{names[id(p)]}"] = _full(st["exp_avg"])
            tensors[f"v.{names[id(p)]}"] = _full(st["exp_avg_sq"])
            tensors[f"step.{names[id(p)]}"] = _full(st["step"]).reshape(1)
    if result and rank == 0:
        save_file(tensors, result)
        Path(result + ".json").write_text(json.dumps({"global_step": trainer.global_step, "lrs": lrs,
                                                      "optimizer_steps": trainer.actor.optimizer_steps,
                                                      "reward_count": trainer.reward_stats.count,
                                                      "backend": trainer.backend.name}))


def _backend(name: str, world: int) -> str:
    return ("fsdp" if world > 1 else "torch") if name == "auto" else name


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a DTensor's shards all-gathered: collective), a contiguous copy on the host."""
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().cpu().clone().contiguous()
def _two_ranks(rank: int, port: int, cfg: str, tmp: str) -> None:
    """Both 2-rank phases in one pair of processes: a fresh run checkpointed at step 2, then the one-rank run's
    step-2 checkpoint resumed for steps 3 and 4."""
    import os

    from services.learner.distributed.env import RankInfo, init_process_group, leave_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    init_process_group(RankInfo(rank, 2, rank, "127.0.0.1", port), "auto", 60.0, "cpu")
    try:
        _phase(rank, 2, cfg, None, 0, 2, 2, f"{tmp}/two", None)
        _phase(rank, 2, cfg, f"{tmp}/one", 2, 2, None, None, f"{tmp}/one_to_two.safetensors")
    finally:
        leave_process_group()


def _compare(name: str, tmp: Path, ref: dict, ref_info: dict) -> tuple:
    got, info = load_file(str(tmp / f"{name}.safetensors")), json.loads((tmp / f"{name}.safetensors.json").read_text())
    assert info["global_step"] == ref_info["global_step"] == TOTAL, name
    assert info["optimizer_steps"] == TOTAL, name  # the step counter came back (a fresh engine would say 2)
    assert info["reward_count"] == ref_info["reward_count"] == 8 * TOTAL, name  # reward statistics of 4 steps
    assert info["lrs"] == pytest.approx(ref_info["lrs"][2:], rel=1e-9), name  # the schedule went on from step 2
    assert got.keys() == ref.keys(), name
    for key, value in ref.items():
        if key.startswith("step."):
            assert float(got[key]) == float(value) == TOTAL, (name, key)  # Adam's bias correction went on
    worst = {kind: max(float((got[k] - ref[k]).abs().max() / ref[k].abs().max().clamp(min=1e-12))
                       for k in ref if k.startswith(kind))
             for kind in ("w.", "m.", "v.")}
    # weights as test_fsdp.py bounds fsdp against torch: 1e-5 relative per tensor (norm) and absolute. Measured
    # 2 -> 1: 3.7e-7 relative, 8.5e-7 absolute (fsdp), 3.2e-7 / 6.8e-7 (torch); the largest entry's difference
    # over the tensor's largest entry is 1.1e-5 under fsdp (its reduce-scatter sums in yet another order)
    weights = max(float((got[k] - ref[k]).norm() / ref[k].norm()) for k in ref if k.startswith("w."))
    absolute = max(float((got[k] - ref[k]).abs().max()) for k in ref if k.startswith("w."))
    assert weights < 1e-5 and absolute < 1e-5 and worst["w."] < 1e-4, (name, weights, absolute, worst)
    assert worst["m."] < 1e-4 and worst["v."] < 1e-4, (name, worst)
    return weights, absolute, worst


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["auto", "torch"], ids=["fsdp", "torch"])
def test_resume_on_another_number_of_ranks_continues_the_run(tiny_model_dir, tmp_path, backend):
    s = settings(tiny_model_dir, tmp_path, algorithm={"name": "grpo", "normalize_rewards": True},
                 optim={"actor_lr": 1e-3, "schedule": "cosine", "warmup_ratio": 0.25, "weight_decay": 0.01},
                 backend={"name": backend})
    cfg = s.model_dump_json()
    torch.set_num_threads(1)
    # one rank, 4 steps in one go (what every resumed run must end at), checkpointed on the way at step 2
    _phase(0, 1, cfg, None, 0, TOTAL, 2, str(tmp_path / "one"), str(tmp_path / "ref.safetensors"))
    mp.start_processes(_two_ranks, args=(free_port(), cfg, str(tmp_path)), nprocs=2, start_method="spawn", join=True)
    _phase(0, 1, cfg, str(tmp_path / "two"), 2, 2, None, None, str(tmp_path / "two_to_one.safetensors"))

    for ckpt, world in (("one", 1), ("two", 2)):
        meta = json.loads((tmp_path / ckpt / "state.json").read_text())
        assert meta["world_size"] == world and meta["engines"]["actor"]["optimizer_steps"] == 2
        shards = sorted(p.name for p in (tmp_path / ckpt / "state").glob("*.safetensors"))
        assert len(shards) == world, shards  # every rank wrote its own file
    ref = load_file(str(tmp_path / "ref.safetensors"))
    ref_info = json.loads((tmp_path / "ref.safetensors.json").read_text())
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert max(float((ref[f"w.{k}"] - v).abs().max()) for k, v in base.items() if f"w.{k}" in ref) > 1e-3  # trained
    _compare("two_to_one", tmp_path, ref, ref_info)
    _compare("one_to_two", tmp_path, ref, ref_info)
    two = json.loads((tmp_path / "one_to_two.safetensors.json").read_text())["backend"]
    assert two == _backend(backend, 2)  # the 2-rank phases ran the backend under test
