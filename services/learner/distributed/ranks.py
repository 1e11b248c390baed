"""The two sides of a data-parallel step: :class:`OwnerLink` (rank 0, inside RLRunner) and
:class:`Follower` (ranks > 0: no HTTP, no Redis; a loop over rank 0's messages).

Per learner step rank 0 sends ``TRAIN`` with every rank's shard (whole groups) plus the whole batch's
scores and size; all ranks then run ``train_step`` together (gradients are summed by all_reduce, loss
denominators are global). ``PUBLISH`` precedes each weight publish (ZeRO-3 gathers are collective),
``CHECKPOINT`` each checkpoint write, ``NOOP`` keeps followers inside the collective timeout while rank
0 waits for rollouts, ``STOP`` ends the followers.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.learner.distributed.env import RankInfo, init_process_group, leave_process_group
from services.learner.settings import LearnerSettings
from shared.schemas import Experience

if TYPE_CHECKING:
    from services.learner.training.rl_trainer import RLTrainer

log = logging.getLogger(__name__)


def _join(settings: LearnerSettings, info: RankInfo):
    """Join the process group; the channel's tensors live where the backend wants them (nccl: this GPU)."""
    import torch
    import torch.distributed as dist

    from services.learner.distributed.channel import StepChannel
    from services.learner.training.models import resolve_device

    device = resolve_device(settings.model.device, info.local_rank)
    init_process_group(info, settings.distributed.backend, settings.distributed.timeout_s, device.type,
                       settings.distributed.bind_addr)
    return StepChannel(device if dist.get_backend() == "nccl" else torch.device("cpu"))


class OwnerLink:
    """Rank 0's handle on the followers. All methods block (call them from a worker thread)."""

    def __init__(self, settings: LearnerSettings, info: RankInfo) -> None:
        from services.learner.distributed.channel import Op

        self.s, self.info, self.Op = settings, info, Op
        self.channel = _join(settings, info)
        self.replica_digests: list[str] = []

    def _guarded(self, fn, *args):
        """A follower that fails (or is killed) during ``fn`` fails rank 0 with one line naming it
        (:mod:`.liveness`)."""
        from services.learner.distributed.liveness import guarded

        return guarded(self.info.world_size, fn, *args)

    def start(self, total_steps: int, resume_dir: Path | None) -> None:
        self._guarded(self.channel.send, self.Op.START, {"total_steps": total_steps,
                                                         "resume_dir": str(resume_dir) if resume_dir else None})

    def train(self, trainer, groups: Sequence[Sequence[Experience]]) -> dict[str, float]:
        return self._guarded(self._train, trainer, groups)

    def _train(self, trainer, groups: Sequence[Sequence[Experience]]) -> dict[str, float]:
        from services.learner.distributed.channel import shard_groups

        shards = shard_groups(groups, self.info.world_size)
        scores = trainer.batch_scores([e for g in groups for e in g])  # as one rank's step would shape them
        meta = {"scores": scores, "samples": len(scores)}
        self.channel.send(self.Op.TRAIN, meta, shards)
        metrics = trainer.train_step(shards[0], batch_scores=scores, batch_samples=len(scores))
        metrics["samples"] = float(len(scores))
        return metrics

    def policy_weights(self, trainer) -> Any:
        return self._guarded(self._policy_weights, trainer)

    def _policy_weights(self, trainer) -> Any:
        self.channel.send(self.Op.PUBLISH)
        return trainer.policy_weights()

    def save(self, trainer, out_dir: Path) -> None:
        self._guarded(self._save, trainer, out_dir)

    def _save(self, trainer, out_dir: Path) -> None:
        from services.learner.training.collectives import replica_digests

        self.channel.send(self.Op.CHECKPOINT, {"path": str(out_dir)})
        trainer.save(out_dir)
        if not trainer.actor.shards_parameters:  # replicated weights: every rank must hold the same bytes
            self.replica_digests = replica_digests(trainer.actor.model)
            (out_dir / "replicas.json").write_text(json.dumps({"actor_sha256": self.replica_digests}))
            if len(set(self.replica_digests)) != 1:
                log.error("replicas diverged: parameter digests %s", self.replica_digests)

    def heartbeat(self) -> None:
        if time.monotonic() - self.channel.last_send >= self.s.distributed.heartbeat_s:
            self._guarded(self.channel.send, self.Op.NOOP)

    def stop(self) -> None:
        try:
            self.channel.send(self.Op.STOP)
        finally:  # also when a follower is gone: no group may outlive the interpreter (see env.py)
            leave_process_group()


class Follower:
    """Rank > 0: build the same trainer, then do what rank 0's messages say until STOP."""

    def __init__(self, settings: LearnerSettings, info: RankInfo) -> None:
        self.s, self.info = settings, info
        self.trainer: RLTrainer | None = None
        self.steps = 0

    def run(self) -> None:

        from services.learner.distributed.liveness import FollowerBeat

        channel = _join(self.s, self.info)
        beat = FollowerBeat(self.info.rank)  # before any message: rank 0 can tell this rank from a lost one
        log.info("learner rank %d/%d following rank 0", self.info.rank, self.info.world_size)
        try:
            self._follow(channel, beat)
        except BaseException as exc:
            beat.failed(exc)  # rank 0 names this rank and the reason
            raise
        finally:
            beat.stop()

    def _follow(self, channel, beat) -> None:
        from services.learner.distributed.channel import Op
        from services.learner.training.collectives import replica_digests
        from services.learner.training.rl_trainer import RLTrainer

        while True:
            msg = channel.recv()
            if msg.op == Op.START:
                resume = msg.meta.get("resume_dir")
                self.trainer = RLTrainer(self.s, int(msg.meta["total_steps"]), Path(resume) if resume else None,
                                         local_rank=self.info.local_rank)
            elif msg.op == Op.TRAIN:
                self._require_trainer(msg.op).train_step(msg.shard, batch_scores=msg.meta["scores"],
                                                         batch_samples=int(msg.meta["samples"]))
                self.steps += 1
            elif msg.op == Op.PUBLISH:
                weights = self._require_trainer(msg.op).policy_weights()  # joins the gather where weights are sharded
                serve = getattr(weights, "serve", None)  # FSDP: join each bucket's gather until rank 0 is done
                if serve is not None:
                    serve()
            elif msg.op == Op.CHECKPOINT:
                trainer = self._require_trainer(msg.op)
                trainer.save_follower(Path(msg.meta["path"]))
                if not trainer.actor.shards_parameters:
                    replica_digests(trainer.actor.model)
            elif msg.op == Op.STOP:
                log.info("rank %d stopping after %d steps", self.info.rank, self.steps)
                beat.stop()
                leave_process_group()
                return

    def _require_trainer(self, op: Any) -> RLTrainer:
        if self.trainer is None:
            raise RuntimeError(f"rank {self.info.rank}: {op.name} before START")
        return self.trainer
