"""Reward-model training: a sequence-classification model (the causal LM's trunk + a scalar ``score`` head, as
the critic is built) trained with the Bradley-Terry loss on preference pairs. The reward of a text is the head's
output at its last token, as the reward service's ``hf_rm`` scorer reads it, and the export is a plain
``*ForSequenceClassification`` checkpoint that scorer loads with no conversion (with ``normalize_reward``,
``mean`` and ``std`` in its config.json when asked, as OpenRLHF writes them)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from services.learner.algorithms.preference_losses import bradley_terry_loss, preference_metrics
from services.learner.preference_data import PreferencePair, rm_ids
from services.learner.settings import LearnerSettings
from services.learner.training import sharded_state
from services.learner.training.backends import TrainEngine
from services.learner.training.base import TrainerBase
from services.learner.training.models import load_critic


def padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and ``attention_mask`` ``[N, L]`` (CPU)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


class RMTrainer(TrainerBase):
    def __init__(self, settings: LearnerSettings, total_steps: int, resume_dir: Path | None = None,
                 local_rank: int = 0) -> None:
        self.rm = settings.algorithm
        if settings.model.lora is not None:
            raise ValueError("model.lora: reward-model training (algorithm rm) trains the whole model; unset lora")
        super().__init__(settings, total_steps, self.rm.batch_size, resume_dir, local_rank)
        if resume_dir is not None:
            self.restore(resume_dir)

    def _build_actor(self, resume_dir: Path | None) -> TrainEngine:
        # a sharded checkpoint's weights are loaded in restore() (as TrainerBase does); only checkpoints of the
        # older layout hold full HF weights in trainer/actor
        old_layout = resume_dir is not None and not sharded_state.is_sharded_checkpoint(resume_dir)
        path = str(resume_dir / "actor") if resume_dir is not None and old_layout else self.settings.model.actor
        model = load_critic(path, self.settings.model, self.device).inner  # the seq-cls model itself
        model.config.pad_token_id = self.pad_id
        return self._engine(model, self.settings.optim.actor_lr)

    # ---- rewards ----------------------------------------------------------------------------------
    def _ids(self, pair: PreferencePair) -> tuple[list[int], list[int]]:
        tok, a = self.tokenizer, self.rm
        return (rm_ids(tok, pair.prompt, pair.chosen, a.append_eos, a.max_length),
                rm_ids(tok, pair.prompt, pair.rejected, a.append_eos, a.max_length))

    def _rewards(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """The model's reward of each token row: the head at the row's last token ``[N]`` (float32)."""
        model = self.actor.model
        ids, mask = padded(rows, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = getattr(model, model.base_model_prefix)(input_ids=ids, attention_mask=mask).last_hidden_state
        values = model.get_submodule("score")(hidden).squeeze(-1).float()
        last = mask.sum(dim=1) - 1
        return values.gather(1, last.unsqueeze(1)).squeeze(1)

    @torch.no_grad()
    def pair_rewards(self, pairs: Sequence[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) rewards ``[P]`` of the current model, no gradient (held-out evaluation)."""
        self.actor.model.eval()
        micro = self.settings.train.micro_batch_size
        chosen, rejected = [], []
        for start in range(0, len(pairs), micro):
            ids = [self._ids(p) for p in pairs[start: start + micro]]
            r = self._rewards([c for c, _ in ids] + [j for _, j in ids])
            chosen.append(r[: len(ids)].cpu())
            rejected.append(r[len(ids):].cpu())
        return torch.cat(chosen), torch.cat(rejected)

    # ---- one step ---------------------------------------------------------------------------------
    def train_step(self, pairs: Sequence[PreferencePair]) -> dict[str, float]:
        t0 = time.perf_counter()
        self.actor.model.train()
        micro = self.settings.train.micro_batch_size
        total, chosen_all, rejected_all, tokens = 0.0, [], [], 0
        for start in range(0, len(pairs), micro):
            part = pairs[start: start + micro]
            ids = [self._ids(p) for p in part]
            tokens += sum(len(c) + len(j) for c, j in ids)
            r = self._rewards([c for c, _ in ids] + [j for _, j in ids])
            chosen, rejected = r[: len(part)], r[len(part):]
            margin = None
            if self.rm.margin_key is not None:
                margin = torch.tensor([p.margin for p in part], dtype=torch.float32, device=self.device)
            loss = bradley_terry_loss(chosen, rejected, margin).sum() / len(pairs)
            self.actor.backward(loss)
            total += loss.item()
            chosen_all.append(chosen.detach().cpu())
            rejected_all.append(rejected.detach().cpu())
        grad_norm = self.actor.step()
        self.global_step += 1
        elapsed = time.perf_counter() - t0
        return {"step": float(self.global_step), "loss": total, "actor_grad_norm": grad_norm,
                "actor_lr": self.actor.lr(), "samples": float(len(pairs)), "tokens": float(tokens),
                "tokens_per_s": tokens / max(elapsed, 1e-9), "step_time_s": elapsed,
                **preference_metrics(torch.cat(chosen_all), torch.cat(rejected_all))}

    # ---- out --------------------------------------------------------------------------------------
    def set_normalization(self, pairs: Sequence[PreferencePair]) -> tuple[float, float]:
        """Mean / std of the rewards of both sides of ``pairs`` into the config (OpenRLHF's normalize_reward)."""
        chosen, rejected = self.pair_rewards(pairs)
        both = torch.cat([chosen, rejected])
        mean, std = both.mean().item(), both.std(unbiased=False).item()
        std = std if math.isfinite(std) and std > 1e-8 else 1.0
        config = self.actor.model.config
        config.normalize_reward, config.mean, config.std = True, mean, std
        return mean, std
