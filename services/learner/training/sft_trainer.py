"""Supervised fine-tuning on (prompt, answer) token pairs: negative log-likelihood of the answer only (and of
only the answer tokens its loss mask keeps, when a pair carries one: a multi-turn transcript's environment
turns are context, as in RL)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch

from services.learner.algorithms.loss_terms import aggregate
from services.learner.settings import LearnerSettings
from services.learner.training.base import TrainerBase
from services.learner.training.batch import SequenceBatch, action_logprobs, build_sequences

Pair = tuple[Sequence[int], Sequence[int]] | tuple[Sequence[int], Sequence[int], Sequence[int]]
"""(prompt ids, answer ids) or (prompt ids, answer ids, loss mask over the answer ids)."""


class SFTTrainer(TrainerBase):
    def __init__(self, settings: LearnerSettings, total_steps: int, resume_dir: Path | None = None,
                 local_rank: int = 0) -> None:
        self.sft = settings.algorithm
        super().__init__(settings, total_steps, self.sft.batch_size, resume_dir, local_rank)
        if resume_dir is not None:
            self.restore(resume_dir)

    def train_step(self, pairs: Sequence[Pair]) -> dict[str, float]:
        t0 = time.perf_counter()
        seqs = build_sequences([p[0] for p in pairs], [p[1] for p in pairs], self.pad_id)
        for i, pair in enumerate(pairs):
            if len(pair) > 2:
                if len(pair[2]) != len(pair[1]):
                    raise ValueError(f"pair {i}: loss mask of {len(pair[2])} for {len(pair[1])} answer tokens")
                seqs["action_mask"][i, : len(pair[2])] = torch.as_tensor(pair[2], dtype=torch.float32)
        batch = SequenceBatch(**seqs)
        batch = batch.to(self.device)
        mask = batch.action_mask
        n_tok, n_seq = mask.sum().clamp(min=1.0), float(batch.size)
        micro = self.settings.train.micro_batch_size
        self.actor.model.train()
        total = 0.0
        for start in range(0, batch.size, micro):
            mb = batch.select(torch.arange(start, min(start + micro, batch.size), device=self.device))
            logp, _ = action_logprobs(self.actor.runner, mb)
            loss = aggregate(-logp, mb.action_mask, self.sft.loss_agg, n_tok, n_seq)
            self.actor.backward(loss)
            total += loss.item()
        grad_norm = self.actor.step()
        self.global_step += 1
        elapsed = time.perf_counter() - t0
        tokens = float(batch.attention_mask.sum())
        return {"step": float(self.global_step), "sft_loss": total, "actor_grad_norm": grad_norm,
                "actor_lr": self.actor.lr(), "samples": n_seq, "tokens": tokens,
                "tokens_per_s": tokens / max(elapsed, 1e-9), "step_time_s": elapsed}
