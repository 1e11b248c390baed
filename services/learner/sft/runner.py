"""The SFT run owner: batches of (prompt, answer) pairs from the dataset, no queue, exact resume.

Used on its own or as the warm-up before RL (the demo runs it first and starts the rollout fleet and
the RL learner from ``checkpoint.export_dir``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Protocol

from services.learner.checkpoint import CheckpointManager
from services.learner.counters import Counters
from services.learner.data import PromptSet
from services.learner.distributed.env import RankInfo
from services.learner.observability import MetricsSink
from services.learner.run_state import RunState
from services.learner.settings import LearnerSettings
from services.learner.sft.plan import sft_plan

log = logging.getLogger(__name__)


class RunTrainer(Protocol):
    """What the run owner asks of its trainer (SFTTrainer; the preference runner's RMTrainer / DPOTrainer)."""

    global_step: int

    def train_step(self, pairs: Any) -> dict[str, float]: ...

    def save(self, out_dir: Path) -> None: ...

    def export(self, out_dir: Path, checkpoint: Path | None = None) -> None: ...


class SFTRunner:
    needs_redis = False

    def __init__(self, settings: LearnerSettings, redis: Any, sink: MetricsSink) -> None:
        self.s = settings
        self.sft = settings.algorithm
        self.sink = sink
        self.ckpt = CheckpointManager(settings.checkpoint_dir, settings.checkpoint.keep)
        self.state = RunState()
        self.trainer: RunTrainer | None = None  # (and data) set by _start
        self.data: PromptSet | None = None
        self.phase = "starting"
        self.error: str | None = None
        self.total_steps = 0
        self.epochs = 1
        self.last_metrics: dict[str, Any] = {}
        self.last_checkpoint: str | None = None
        self._since_commit = 0
        self._waiters: list[asyncio.Future] = []

    async def _start(self) -> None:
        from services.learner.training.models import load_tokenizer
        from services.learner.training.sft_trainer import SFTTrainer

        tokenizer = await asyncio.to_thread(load_tokenizer, self.s.model)
        self.data = await asyncio.to_thread(PromptSet.load, self.s.data, self.s.train.seed, tokenizer, True)
        latest = self.ckpt.latest() if self.s.checkpoint.resume else None
        if latest is not None:
            self.state = RunState.load(latest / "run_state.json")
            self.last_checkpoint = str(latest)
        t = self.s.train
        steps = sft_plan(self.s.data, self.sft, t.max_steps, "max_steps" in t.model_fields_set, len(self.data))
        self.epochs, self.total_steps = steps.epochs, steps.total_steps
        log.info(steps.note)
        resume_dir = latest / "trainer" if latest is not None else None
        self.trainer = trainer = await asyncio.to_thread(SFTTrainer, self.s, self.total_steps, resume_dir,
                                                         RankInfo.from_env().local_rank)
        self.sink.open(self.total_steps, trainer.global_step)

    def _done(self) -> bool:
        assert self.trainer is not None  # started
        return self.state.epoch >= self.epochs or self.trainer.global_step >= self.total_steps

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._start()
            assert self.trainer is not None and self.data is not None  # _start sets both
            self.phase = "running"
            while not stop.is_set() and not self._done():
                st = self.state
                end = min(st.next_index + self.sft.batch_size, len(self.data))
                pairs = [self.data.sft_pair(st.epoch, i) for i in range(st.next_index, end)]
                metrics = await asyncio.to_thread(self.trainer.train_step, pairs)
                st.next_index = end
                if end >= len(self.data):
                    st.epoch, st.next_index = st.epoch + 1, 0
                Counters(st, self.sink).add("samples_trained", len(pairs))  # the state as loaded (resume)
                metrics.update({"epoch": st.epoch, "samples_trained": st.counters["samples_trained"]})
                self.last_metrics = metrics
                self.sink.log_step(self.trainer.global_step, metrics)
                self._since_commit += 1
                if self.trainer.global_step % self.s.checkpoint.every == 0 or self._waiters:
                    await self._commit()
            if self._since_commit or self._waiters or self.last_checkpoint is None:
                await self._commit()
            if self.s.checkpoint.export_dir and not stop.is_set():
                await asyncio.to_thread(self.trainer.export, Path(self.s.checkpoint.export_dir))
            self.phase = "stopped" if stop.is_set() else "finished"
        except Exception as exc:
            self.phase, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("SFT run failed")
            raise
        finally:
            for fut in self._waiters:
                if not fut.done():
                    fut.set_exception(RuntimeError(f"run ended ({self.phase}) before the checkpoint"))

    async def _commit(self) -> None:
        snapshot = self.state.to_json()
        trainer = self.trainer
        assert trainer is not None  # a checkpoint is committed once the run has started

        def write(tmp: Path) -> None:
            trainer.save(tmp / "trainer")
            (tmp / "run_state.json").write_text(snapshot)

        path = await asyncio.to_thread(self.ckpt.save, trainer.global_step, write)
        self.last_checkpoint, self._since_commit = str(path), 0
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result({"step": trainer.global_step, "path": str(path)})

    def request_checkpoint(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def status(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "error": self.error, "algorithm": "sft",
            "step": self.trainer.global_step if self.trainer else 0, "total_steps": self.total_steps,
            "weight_version": 0, "epoch": self.state.epoch, "next_index": self.state.next_index,
            "counters": dict(self.state.counters), "last_checkpoint": self.last_checkpoint,
            "last_metrics": self.last_metrics,
        }
