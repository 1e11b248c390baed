"""What the fsdp backend refuses, with a message that says what to do: an older full-state checkpoint (it reads
DCP shards only) and a final export without a checkpoint to read it from (it never gathers the live shards).

One fsdp rank in a spawned process (a process group of one, gloo); the older checkpoint is written here by a
one-rank ``torch`` trainer in the layout checkpoints had before DCP shards."""

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from shared.ports import free_port
from tests.learner.helpers import good_bad_batch, settings

pytestmark = pytest.mark.process  # the fsdp rank runs in a spawned process (a process group of its own)


def _fsdp_rank(rank: int, port: int, cfg: str, old: str, out: str) -> None:
    import torch.distributed as dist

    from services.learner.distributed.env import leave_process_group
    from services.learner.settings import LearnerSettings
    from services.learner.training.rl_trainer import RLTrainer

    torch.set_num_threads(1)
    # a group of one (the learner's own init skips a one-rank group: fsdp is meant for several)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    said = {}
    try:
        s = LearnerSettings(**json.loads(cfg))
        try:
            RLTrainer(s, total_steps=4, resume_dir=Path(old))
        except ValueError as exc:
            said["resume"] = str(exc)
        trainer = RLTrainer(s, total_steps=4)
        said["backend"] = trainer.backend.name
        try:
            trainer.export(Path(out) / "export")
        except ValueError as exc:
            said["export"] = str(exc)
    finally:
        leave_process_group()
        Path(out, "said.json").write_text(json.dumps(said))


@pytest.mark.timeout(180)
def test_fsdp_refuses_an_older_full_checkpoint_and_an_export_without_a_checkpoint(tiny_model_dir, tmp_path):
    from services.learner.training.rl_trainer import RLTrainer
    from services.learner.training.rng import save_rng

    torch.set_num_threads(1)
    old = tmp_path / "old" / "trainer"
    a = RLTrainer(settings(tiny_model_dir, tmp_path), total_steps=4)
    a.train_step(good_bad_batch(0))
    a.actor.model.save_pretrained(old / "actor", safe_serialization=True)  # the layout before DCP shards
    a.tokenizer.save_pretrained(old / "actor")
    a.actor.save_state(old / "actor_optim")
    save_rng(old / "rng.pt")
    (old / "trainer.json").write_text(json.dumps({"global_step": a.global_step, **a.extra_state()}))

    cfg = settings(tiny_model_dir, tmp_path, backend={"name": "fsdp"}).model_dump_json()
    mp.start_processes(_fsdp_rank, args=(free_port(), cfg, str(old), str(tmp_path)), nprocs=1, start_method="spawn",
                       join=True)
    said = json.loads((tmp_path / "said.json").read_text())
    assert said["backend"] == "fsdp"
    assert said["resume"] == (f"{old} is an older full-state checkpoint; backend fsdp reads sharded ones only: "
                              "resume it once on one rank with backend torch (its next checkpoint is sharded)")
    assert said["export"] == ("backend fsdp shards the weights over ranks: the export is read from a checkpoint, "
                              "and none was given (pass a step-* checkpoint, or run fleetrl export RUN_DIR --out DIR)")
    assert not (tmp_path / "export").exists()
