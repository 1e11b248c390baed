"""One learner rank for the FSDP and DeepSpeed tests: ``python -m tests.learner.training.multirank_worker SPEC.json``.

The launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) say which rank this is; with WORLD_SIZE 1
no process group is made (the ``torch`` backend's one rank). The spec (JSON) names the tiny model, the
settings sections, the step batches (group counts) and where to write. Each rank builds a real
:class:`RLTrainer` and trains the same batches: rank 0 of N takes the shards ``shard_groups`` gives it, exactly
as the multi-rank learner does. Rank 0 writes ``result.json`` (per step: the summed loss, the gradient norm) and
``weights.safetensors`` (the full weights after the last step). With ``publish`` in the spec, rank 0 then
publishes through a real :class:`WeightPublisher` (the Redis at ``redis_url``) and records the version's
checksums and what the gathers held; the other ranks serve its gathers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(spec_path: str) -> None:
    from services.learner.distributed.channel import shard_groups
    from services.learner.distributed.env import RankInfo, init_process_group, leave_process_group
    from services.learner.training.collectives import all_sum
    from services.learner.training.rl_trainer import RLTrainer
    from tests.learner.helpers import good_bad_batch, settings

    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    info = RankInfo.from_env()
    init_process_group(info, "gloo", 60.0, "cpu")
    s = settings(Path(spec["model"]), out, **spec["settings"])
    steps = spec["steps"]
    trainer = RLTrainer(s, total_steps=len(steps))
    rows = []
    for step, n_groups in enumerate(steps):
        batch = good_bad_batch(step, n_groups)
        groups = [batch[i:i + 4] for i in range(0, len(batch), 4)]
        mine = shard_groups(groups, info.world_size)[info.rank]
        m = trainer.train_step(mine, batch_scores=[e.reward for e in batch], batch_samples=len(batch))
        loss = all_sum(torch.tensor([m.get("policy_loss", 0.0)], dtype=torch.float64))  # each rank's part
        rows.append({"loss": float(loss[0]), "grad_norm": m.get("actor_grad_norm", 0.0),
                     "critic_grad_norm": m.get("critic_grad_norm", 0.0),
                     "lr": trainer.actor.lr()})
    state = trainer.actor.full_state_dict()
    result = {"steps": rows, "backend": trainer.backend.name, "optimizer_steps": trainer.actor.optimizer_steps}
    if spec.get("publish"):
        result["publish"] = publish(trainer, spec["publish"], info.rank)
        if info.rank == 0:  # the same weights, unsharded: a fresh model holding them, published as a module
            from transformers import AutoModelForCausalLM

            plain = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
            plain.load_state_dict(state)
            result["publish_unsharded"] = asyncio.run(_publish(plain, {**spec["publish"],
                                                                       "run": spec["publish"]["run"] + "-plain"}))
    if spec.get("checkpoint"):
        result["resume"] = checkpoint_and_resume(trainer, s, len(steps), out, info, state)
    if info.rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.clone().contiguous() for k, v in state.items()}, str(out / "weights.safetensors"))
        (out / "result.json").write_text(json.dumps(result))
    if info.multi:
        dist.barrier()
    leave_process_group()


def checkpoint_and_resume(trainer, s, total_steps: int, out: Path, info, state: dict) -> dict:
    """Save a sharded checkpoint (every rank writes its shards), export the model from it on rank 0, build a second
    trainer from the checkpoint, then train both one more step on the same shard: the resumed one must match bit
    for bit."""
    from safetensors.torch import load_file

    from services.learner.training.rl_trainer import RLTrainer
    from services.learner.training.rng import load_rng
    from tests.learner.helpers import good_bad_batch

    ck, export = out / "ckpt" / "trainer", out / "export"
    if info.rank == 0:
        trainer.save(ck)
    else:
        trainer.save_follower(ck)
    if info.multi:
        dist.barrier()
    if info.rank == 0:
        trainer.export(export, ck.parent)  # a sharding backend reads the checkpoint's shards; else the live model
    resumed = RLTrainer(s, total_steps=total_steps, resume_dir=ck)
    batch = good_bad_batch(99, info.world_size)
    mine = batch[4 * info.rank:4 * info.rank + 4]
    states = []
    for t in (trainer, resumed):
        load_rng(ck / "rng.pt")
        t.train_step(mine, batch_scores=[e.reward for e in batch], batch_samples=len(batch))
        states.append(t.actor.full_state_dict())
    if info.rank != 0:
        return {}
    exported = load_file(str(export / "model.safetensors"))
    return {"global_step": resumed.global_step, "optimizer_steps": resumed.actor.optimizer_steps,
            "max_diff": max(float((states[0][k] - states[1][k]).abs().max()) for k in states[0]),
            "exported": len(exported), "export_max_diff": max(float((v - state[k]).abs().max()) for k, v in exported.items()),
            "sharded_checkpoint": (ck / "state.json").is_file(),
            "checkpoint_engines": sorted(json.loads((ck / "state.json").read_text())["engines"])
            if (ck / "state.json").is_file() else sorted(d.name for d in ck.glob("*_optim"))}


def publish(trainer, opts: dict, rank: int) -> dict:
    """Rank 0 publishes the trained actor (sharded or not); the others serve the gathers (FSDP: bucket by bucket;
    DeepSpeed ZeRO-3: the one gather ``policy_weights`` joined)."""
    weights = trainer.policy_weights()
    if rank != 0:
        return {"served": weights.serve()} if hasattr(weights, "serve") else {"served": 0}
    return asyncio.run(_publish(weights, opts))


async def _publish(weights, opts: dict) -> dict:
    import redis.asyncio as aioredis

    from services.learner.weights import WeightPublisher
    from shared.weight_sync import keys as wkeys
    from shared.weight_sync.settings import WeightSyncSettings
    from shared.weight_sync.wire import Checksums

    client = aioredis.from_url(opts["redis_url"])
    sync = WeightSyncSettings(bucket_bytes=opts["bucket_bytes"], retain="copy", checksum=True)
    publisher = WeightPublisher(client, opts["run"], sync)
    try:
        version = await publisher.publish(weights)
        sums = Checksums.loads(await client.get(wkeys.checksums(opts["run"], version)))
        out = {"version": version, "checksums": list(sums.values), "algo": sums.algo,
               "buckets": len(publisher.outbox.manifest.buckets)}
        pool = [b.numel() for b in publisher.outbox._pool if b is not None]
        out["pool_bytes"] = sum(pool)
        if hasattr(weights, "peak_gather_bytes"):
            out["peak_gather_bytes"] = weights.peak_gather_bytes
            out["gathered_bytes"] = weights.gathered_bytes
        return out
    finally:
        await publisher.close()
        await client.aclose()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
