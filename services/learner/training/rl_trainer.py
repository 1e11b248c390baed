"""One RL learner step: experiences -> old/ref logprobs, values -> advantages -> PPO epochs of updates."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from services.learner.algorithms.kl import kl_estimate
from services.learner.algorithms.losses import aggregate, clipped_surrogate, truncated_is_weights, value_loss
from services.learner.algorithms.masked import masked_mean
from services.learner.algorithms.normalize import RunningMeanStd
from services.learner.algorithms.registry import AdvantageInputs, build_algorithm
from services.learner.distributed.collectives import all_sum, global_whiten
from services.learner.settings import LearnerSettings
from shared.schemas import Experience

from .backends import TrainEngine
from .base import TrainerBase
from .batch import RLBatch, SequenceBatch, action_logprobs, action_values, build_rl_batch
from .models import load_critic, load_reference

log = logging.getLogger(__name__)


class RLTrainer(TrainerBase):
    """PPO / GRPO / REINFORCE++ / RLOO updates on batches of complete groups."""

    def __init__(self, settings: LearnerSettings, total_steps: int, resume_dir: Path | None = None,
                 local_rank: int = 0) -> None:
        self.algo_settings = settings.algorithm
        self.algorithm = build_algorithm(settings.algorithm)
        samples = settings.train.groups_per_step * settings.rollout.group_size
        mini = min(settings.train.mini_batch_size or samples, samples)
        optimizer_steps = total_steps * self.algo_settings.ppo_epochs * -(-samples // mini)
        super().__init__(settings, optimizer_steps, mini, resume_dir, local_rank)
        temp = settings.rollout.sampling.temperature
        self.temperature = temp if temp else 1.0  # greedy sampling: logprobs of the untempered policy
        self.reward_stats = RunningMeanStd()
        self.reference = load_reference(settings.model, self.device) if self.algorithm.needs_reference else None
        self.critic: TrainEngine | None = None
        if self.algorithm.needs_critic:
            path = str(resume_dir / "critic") if resume_dir else (settings.model.critic or settings.model.actor)
            critic = load_critic(path, settings.model, self.device)
            self.critic = self._engine(critic, settings.optim.critic_lr)
        if resume_dir is not None:
            self.restore(resume_dir)

    # ---- state ------------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {"reward_stats": self.reward_stats.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.reward_stats.load_state_dict(state["reward_stats"])

    def _save_more(self, out_dir: Path) -> None:
        if self.critic is not None:
            self.critic.model.save_pretrained(out_dir / "critic", safe_serialization=True)
            self.critic.save_state(out_dir / "critic_optim")

    def _restore_more(self, in_dir: Path) -> None:
        if self.critic is not None:
            self.critic.load_state(in_dir / "critic_optim")

    # ---- the step -----------------------------------------------------------------------------------
    def _no_grad_pass(self, fn: Callable[[SequenceBatch], torch.Tensor], batch: RLBatch) -> torch.Tensor:
        out = torch.zeros_like(batch.action_mask)
        micro = self.settings.train.micro_batch_size
        with torch.no_grad():
            for start in range(0, batch.size, micro):
                idx = torch.arange(start, min(start + micro, batch.size), device=self.device)
                mb = batch.select(idx)
                out[idx, : mb.action_mask.shape[1]] = fn(mb).float()
        return out

    def _scores(self, raw: torch.Tensor, batch_scores: torch.Tensor) -> torch.Tensor:
        a = self.algo_settings
        scores = raw
        if a.normalize_rewards:  # statistics of the whole step batch: the same on every rank
            self.reward_stats.update(batch_scores)
            scores = self.reward_stats.normalize(raw)
        if a.reward_clip is not None:
            scores = scores.clamp(-a.reward_clip, a.reward_clip)
        return scores

    def _updates(self, total: int) -> int:
        """Optimizer updates per PPO epoch for a step batch of ``total`` samples (over all ranks)."""
        mini = min(self.settings.train.mini_batch_size or total, total)
        return -(-total // mini)

    def _chunks(self, size: int, total: int) -> list[torch.Tensor]:
        """This rank's mini-batches of one epoch: on one rank ``mini_batch_size`` slices of a permutation;
        on N ranks the local shard split into the same number of updates as every other rank."""
        perm = torch.randperm(size).to(self.device)
        if size == total:
            mini = min(self.settings.train.mini_batch_size or size, size)
            return [perm[start : start + mini] for start in range(0, size, mini)]
        return list(torch.tensor_split(perm, self._updates(total)))

    def _empty_step(self, total: int) -> dict[str, float]:
        """A rank whose shard is empty (fewer groups than ranks) joins every collective with zeros."""
        a = self.algo_settings
        if a.normalize_advantages:
            global_whiten(torch.zeros(1, 1, device=self.device), torch.zeros(1, 1, device=self.device))
        train_actor = self.global_step >= self.settings.train.freeze_actor_steps
        for _epoch in range(a.ppo_epochs):
            for _ in range(self._updates(total)):
                all_sum(torch.zeros(2, dtype=torch.float64, device=self.device))
                if train_actor:
                    self.actor.step()
                if self.critic is not None:
                    self.critic.step()
        self.global_step += 1
        return {"step": float(self.global_step), "samples": 0.0}

    def train_step(self, experiences: Sequence[Experience], batch_scores: Sequence[float] | None = None,
                   batch_samples: int | None = None) -> dict[str, float]:
        """Train on ``experiences`` (complete groups). Returns the step's metrics.

        On N ranks ``experiences`` is this rank's shard; ``batch_scores`` / ``batch_samples`` describe the
        whole step batch (reward statistics and loss denominators are global, so N ranks x B/N samples
        give the update of 1 rank x B samples).
        """
        t0 = time.perf_counter()
        a, train = self.algo_settings, self.settings.train
        total = batch_samples if batch_samples is not None else len(experiences)
        if not experiences:
            return self._empty_step(total)
        batch = build_rl_batch(experiences, self.pad_id).to(self.device)
        mask = batch.action_mask
        actor, temp = self.actor.model, self.temperature

        actor.eval()
        old_lp = self._no_grad_pass(lambda mb: action_logprobs(actor, mb, temp)[0], batch)
        ref_lp = None
        if self.reference is not None:
            ref_lp = self._no_grad_pass(lambda mb: action_logprobs(self.reference, mb, temp)[0], batch)
        values = None
        if self.critic is not None:
            self.critic.model.eval()
            values = self._no_grad_pass(lambda mb: action_values(self.critic.model, mb), batch)

        kl = kl_estimate(old_lp, ref_lp, a.kl.estimator, mask) if ref_lp is not None else torch.zeros_like(mask)
        all_scores = batch.scores if batch_scores is None else torch.tensor(list(batch_scores), dtype=torch.float32)
        scores = self._scores(batch.scores, all_scores)
        adv, returns = self.algorithm.advantages(
            AdvantageInputs(scores=scores, groups=batch.groups, mask=mask, kl=kl, values=values, whiten=global_whiten)
        )
        tis = (truncated_is_weights(old_lp, batch.engine_logprobs, a.tis_cap) if a.tis_cap is not None
               else torch.ones_like(mask))

        train_actor = self.global_step >= train.freeze_actor_steps
        acc = _Accumulator()
        size = batch.size
        actor.train()
        if self.critic is not None:
            self.critic.model.train()
        for _epoch in range(a.ppo_epochs):
            for m_idx in self._chunks(size, total):
                local = torch.stack([mask[m_idx].sum().double(),
                                     torch.tensor(float(len(m_idx)), dtype=torch.float64, device=mask.device)])
                counts = all_sum(local)  # global token / sequence counts of this update
                n_tok = counts[0].to(mask.dtype).clamp(min=1.0)
                n_seq = float(counts[1])
                for ms in range(0, len(m_idx), train.micro_batch_size):
                    idx = m_idx[ms : ms + train.micro_batch_size]
                    mb = batch.select(idx)
                    cols = functools.partial(_rows_cols, idx=idx, width=mb.action_mask.shape[1])

                    if train_actor:
                        self._actor_micro(mb, cols, old_lp, adv, tis, ref_lp, n_tok, n_seq, acc)
                    if self.critic is not None:
                        v = action_values(self.critic.model, mb)
                        vl = aggregate(value_loss(v, cols(values), cols(returns), a.value_clip), mb.action_mask,
                                       a.loss_agg, n_tok, n_seq)
                        self.critic.backward(vl)
                        acc.add("value_loss", vl.item())
                if train_actor:
                    acc.add("actor_grad_norm", self.actor.step(), per_update=True)
                if self.critic is not None:
                    acc.add("critic_grad_norm", self.critic.step(), per_update=True)

        self.global_step += 1
        elapsed = time.perf_counter() - t0
        tokens = int(batch.attention_mask.sum().item())
        metrics = {
            "step": float(self.global_step),
            "reward_mean": float(batch.scores.mean()),
            "reward_std": float(batch.scores.std(unbiased=False)),
            "score_mean": float(scores.mean()),
            "kl": float(masked_mean(kl, mask)) if ref_lp is not None else 0.0,
            "advantage_mean": float(masked_mean(adv, mask)),
            "advantage_std": float(masked_mean((adv - masked_mean(adv, mask)) ** 2, mask).sqrt()),
            "return_mean": float(masked_mean(returns, mask)),
            "tis_mean": float(masked_mean(tis, mask)),
            "tis_capped_frac": float(masked_mean((tis >= (a.tis_cap or float("inf"))).float(), mask)),
            "engine_logprob_gap": float(masked_mean((old_lp - batch.engine_logprobs).abs(), mask)),
            "response_len_mean": float(mask.sum(-1).mean()),
            "samples": float(size),
            "tokens": float(tokens),
            "tokens_per_s": tokens * a.ppo_epochs / max(elapsed, 1e-9),
            "step_time_s": elapsed,
            "actor_lr": self.actor.lr(),
            "actor_frozen": float(not train_actor),
            **acc.means(),
        }
        if self.critic is not None:
            metrics["critic_lr"] = self.critic.lr()
            metrics["value_mean"] = float(masked_mean(values, mask))
        return metrics

    def _actor_micro(self, mb: SequenceBatch, cols, old_lp, adv, tis, ref_lp, n_tok, n_seq, acc) -> None:
        a = self.algo_settings
        logp, entropy = action_logprobs(self.actor.model, mb, self.temperature, with_entropy=True,
                                        entropy_grad=a.entropy_coef > 0)
        m = mb.action_mask
        out = clipped_surrogate(logp, cols(old_lp), cols(adv), a.eps_low, a.eps_high, a.dual_clip)
        pg_loss = aggregate(out.loss * cols(tis), m, a.loss_agg, n_tok, n_seq)
        loss = pg_loss
        ent = aggregate(entropy, m, a.loss_agg, n_tok, n_seq)
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * ent
        if self.algorithm.kl_loss_coef > 0 and ref_lp is not None:
            kl_loss = aggregate(kl_estimate(logp, cols(ref_lp), a.kl.estimator, m), m, a.loss_agg, n_tok, n_seq)
            loss = loss + self.algorithm.kl_loss_coef * kl_loss
            acc.add("kl_loss", kl_loss.item())
        self.actor.backward(loss)
        acc.add("policy_loss", pg_loss.item())
        acc.add("entropy", ent.item())
        acc.count("clip_frac", float((out.clipped * m).sum()), float(m.sum()))
        acc.count("ratio_mean", float((out.ratio.detach() * m).sum()), float(m.sum()))


def _rows_cols(t: torch.Tensor, idx: torch.Tensor, width: int) -> torch.Tensor:
    """Rows ``idx`` of a full-batch ``[B, R]`` tensor, cut to a micro-batch's response width."""
    return t[idx][:, :width]


class _Accumulator:
    """Sums of per-micro-batch contributions (already normalised by mini-batch totals) per update."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.updates: dict[str, int] = {}
        self.ratios: dict[str, list[float]] = {}
        self.n_updates = 0

    def add(self, name: str, value: float, per_update: bool = False) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value
        if per_update:
            self.updates[name] = self.updates.get(name, 0) + 1

    def count(self, name: str, num: float, den: float) -> None:
        n, d = self.ratios.get(name, [0.0, 0.0])
        self.ratios[name] = [n + num, d + den]

    def means(self) -> dict[str, float]:
        n_updates = max(self.updates.values(), default=1)
        out = {k: v / (self.updates.get(k) or n_updates) for k, v in self.sums.items()}
        out.update({k: n / max(d, 1.0) for k, (n, d) in self.ratios.items()})
        return out
