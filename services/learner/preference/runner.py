"""The offline preference run owner (``algorithm: rm`` and ``algorithm: dpo``): batches of preference pairs from
``data.path``, no queue, no fleet, exact resume; the SFT run owner's loop (steps, checkpoints, export) with
pairs instead of (prompt, answer) pairs.

Held-out pairs (``data.eval_path``; ``fleetrl run`` sets it from ``eval.data``) are measured before the first
step of a fresh run, every ``algorithm.eval_every`` steps and after the last: pairwise accuracy (the chosen
side's reward above the rejected one's; DPO: its implicit reward beta * log(pi / ref)) and the mean margin.
Each point is a line of ``run_dir/heldout_pairs.jsonl`` and is added to that step's metrics
(``heldout/accuracy``, ``heldout/margin``); the run ends with the line
``held-out pairwise accuracy: NN.N% (start) -> NN.N% (end)`` in its log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.learner.algorithms.preference_losses import preference_metrics
from services.learner.counters import Counters
from services.learner.preference_data import PairSet, PreferencePair, read_pairs
from services.learner.sft.plan import sft_plan
from services.learner.sft.runner import SFTRunner

if TYPE_CHECKING:
    from services.learner.training.dpo_trainer import DPOTrainer
    from services.learner.training.rm_trainer import RMTrainer

log = logging.getLogger(__name__)

TRAINERS = {"rm": "services.learner.training.rm_trainer:RMTrainer",
            "dpo": "services.learner.training.dpo_trainer:DPOTrainer"}


def heldout_line(points: list[dict]) -> str | None:
    """The run's closing line from its held-out points (the first and the last), or None without two."""
    if len(points) < 2:
        return None
    a, b = points[0]["accuracy"], points[-1]["accuracy"]
    return (f"held-out pairwise accuracy: {a:.1%} (start) -> {b:.1%} (end)   mean margin "
            f"{points[0]['margin']:.3f} -> {points[-1]['margin']:.3f}   ({points[-1]['pairs']} pairs, steps "
            f"{points[0]['step']} -> {points[-1]['step']})")


class PreferenceRunner(SFTRunner):
    needs_redis = False
    trainer: RMTrainer | DPOTrainer | None
    data: PairSet | None

    def __init__(self, settings, redis: Any, sink) -> None:
        super().__init__(settings, redis, sink)
        self.pref = settings.algorithm
        self.heldout: list[PreferencePair] = []
        self.points_path = Path(settings.run_dir) / "heldout_pairs.jsonl"

    def _keys(self) -> dict[str, Any]:
        a = self.pref
        ref = (a.ref_chosen_key, a.ref_rejected_key) if getattr(a, "ref_chosen_key", None) else None
        return {"margin_key": getattr(a, "margin_key", None), "ref_keys": ref}

    async def _start(self) -> None:
        from shared.service_kit.loader import load_object

        keys = self._keys()
        self.data = await asyncio.to_thread(PairSet.load_pairs, self.s.data, self.s.train.seed, **keys)
        if self.s.data.eval_path:
            self.heldout = await asyncio.to_thread(read_pairs, self.s.data.eval_path, self.s.data,
                                                   keys["margin_key"], keys["ref_keys"], self.pref.eval_max_pairs)
        latest = self.ckpt.latest() if self.s.checkpoint.resume else None
        if latest is not None:
            from services.learner.run_state import RunState

            self.state = RunState.load(latest / "run_state.json")
            self.last_checkpoint = str(latest)
        t = self.s.train
        steps = sft_plan(self.s.data, self.pref, t.max_steps, "max_steps" in t.model_fields_set, len(self.data))
        self.epochs, self.total_steps = steps.epochs, steps.total_steps
        log.info(steps.note)
        resume_dir = latest / "trainer" if latest is not None else None
        trainer_cls = load_object(TRAINERS[self.pref.name], what=f"trainer of algorithm {self.pref.name}")
        self.trainer = trainer = await asyncio.to_thread(trainer_cls, self.s, self.total_steps, resume_dir)
        self.sink.open(self.total_steps, trainer.global_step)

    # ---- held-out -----------------------------------------------------------------------------------
    def _points(self) -> list[dict]:
        if not self.points_path.is_file():
            return []
        return [json.loads(line) for line in self.points_path.read_text().splitlines() if line.strip()]

    async def _evaluate(self) -> dict[str, float]:
        if not self.heldout:
            return {}
        assert self.trainer is not None  # started
        chosen, rejected = await asyncio.to_thread(self.trainer.pair_rewards, self.heldout)
        m = preference_metrics(chosen, rejected)
        point = {"step": self.trainer.global_step, "accuracy": m["rewards/accuracies"],
                 "margin": m["rewards/margins"], "pairs": len(self.heldout)}
        self.points_path.parent.mkdir(parents=True, exist_ok=True)
        with self.points_path.open("a") as f:
            f.write(json.dumps(point) + "\n")
        log.info("held-out pairwise accuracy at step %d: %.1f%% (mean margin %.3f, %d pairs)", point["step"],
                 100 * point["accuracy"], point["margin"], point["pairs"])
        self.heldout_points.append(point)
        return {"heldout/accuracy": point["accuracy"], "heldout/margin": point["margin"]}

    def _due(self) -> bool:
        every = self.pref.eval_every
        assert self.trainer is not None  # started
        return bool(every) and self.trainer.global_step % every == 0

    # ---- the loop -----------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._start()
            assert self.trainer is not None and self.data is not None  # _start sets both
            self.heldout_points = self._points()
            if self.heldout and self.trainer.global_step == 0:
                self.points_path.unlink(missing_ok=True)  # a fresh run's history starts here
                self.heldout_points = []
                await self._evaluate()
            self.phase = "running"
            last_eval = -1
            while not stop.is_set() and not self._done():
                st = self.state
                end = min(st.next_index + self.pref.batch_size, len(self.data))
                pairs = [self.data.pair(st.epoch, i) for i in range(st.next_index, end)]
                metrics = await asyncio.to_thread(self.trainer.train_step, pairs)
                st.next_index = end
                if end >= len(self.data):
                    st.epoch, st.next_index = st.epoch + 1, 0
                Counters(st, self.sink).add("samples_trained", len(pairs))  # the state as loaded (resume)
                metrics.update({"epoch": st.epoch, "samples_trained": st.counters["samples_trained"]})
                if self._due() or (self._done() and not stop.is_set()):
                    metrics.update(await self._evaluate())
                    last_eval = self.trainer.global_step
                self.last_metrics = metrics
                self.sink.log_step(self.trainer.global_step, metrics)
                self._since_commit += 1
                if self.trainer.global_step % self.s.checkpoint.every == 0 or self._waiters:
                    await self._commit()
            if self.heldout and not stop.is_set() and last_eval != self.trainer.global_step and \
                    (not self.heldout_points or self.heldout_points[-1]["step"] != self.trainer.global_step):
                self.last_metrics.update(await self._evaluate())
            if self._since_commit or self._waiters or self.last_checkpoint is None:
                await self._commit()
            if self.s.checkpoint.export_dir and not stop.is_set():
                await asyncio.to_thread(self._export, Path(self.s.checkpoint.export_dir))
            line = heldout_line(self.heldout_points)
            if line and not stop.is_set():
                log.info(line)
                self.last_metrics["heldout_line"] = line
            self.phase = "stopped" if stop.is_set() else "finished"
        except Exception as exc:
            self.phase, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("%s run failed", self.pref.name)
            raise
        finally:
            for fut in self._waiters:
                if not fut.done():
                    fut.set_exception(RuntimeError(f"run ended ({self.phase}) before the checkpoint"))

    def _export(self, out: Path) -> None:
        assert self.trainer is not None and self.data is not None  # started
        if getattr(self.pref, "normalize_reward", False):
            from services.learner.training.rm_trainer import RMTrainer

            assert isinstance(self.trainer, RMTrainer)  # normalize_reward is the rm algorithm's setting
            pairs = self.data.pairs[: self.pref.normalize_max_pairs]
            mean, std = self.trainer.set_normalization(pairs)
            log.info("normalize_reward: mean %.4f std %.4f over %d training pairs, written to config.json", mean, std,
                     len(pairs))
        self.trainer.export(out)

    def status(self) -> dict[str, Any]:
        out = super().status()
        out["algorithm"] = self.pref.name
        out["heldout_pairs"] = getattr(self, "heldout_points", [])
        return out
