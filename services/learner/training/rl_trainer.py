"""One RL learner step: experiences -> old/ref logprobs, values -> advantages -> PPO epochs of updates."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from services.learner.algorithms.corrections import build_correction
from services.learner.algorithms.kl import kl_estimate
from services.learner.algorithms.loss_terms import aggregate, value_loss
from services.learner.algorithms.masked import masked_mean
from services.learner.algorithms.normalize import RunningMeanStd
from services.learner.algorithms.policy_losses import PolicyLossInputs, build_policy_loss
from services.learner.algorithms.rl_algorithms import AdvantageInputs, build_algorithm
from services.learner.settings import LearnerSettings
from services.learner.training import sharded_state
from services.learner.training.backends import TrainEngine
from services.learner.training.base import TrainerBase
from services.learner.training.batch import (
    RLBatch,
    action_logprobs,
    action_values,
    build_rl_batch,
)
from services.learner.training.collectives import all_sum, global_whiten
from services.learner.training.lockstep import extra_passes, idle_pass
from services.learner.training.micro_batches import by_count, by_token_budget
from services.learner.training.models import Critic, load_critic, load_reference
from services.learner.training.rl_stages import (
    UPDATE_COUNTS,
    LossInputs,
    Pass,
    PreparedBatch,
    batch_metrics,
    loss_mask,
    step_kl,
    step_scores,
    update_counts,
)
from shared.schemas import Experience

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
        self._dropout_free: bool | None = None  # the actor has no dropout (known after the first step)
        self.correction = build_correction(self.algo_settings.correction)
        self.policy_loss = build_policy_loss(self.algo_settings.policy_loss)
        self.loss_agg = self.algo_settings.policy_loss.aggregation or self.algo_settings.loss_agg
        self.reference = self._frozen(load_reference(settings.model, self.device)) \
            if self.algorithm.needs_reference else None
        self.critic: TrainEngine[Critic] | None = None
        if self.algorithm.needs_critic:
            path = settings.model.critic or settings.model.actor
            if resume_dir is not None and not sharded_state.is_sharded_checkpoint(resume_dir):  # the old format
                path = str(resume_dir / "critic")
            critic = load_critic(path, settings.model, self.device)
            self.critic = self._engine(critic, settings.optim.critic_lr)
        if resume_dir is not None:
            self.restore(resume_dir)

    def batch_scores(self, experiences: Sequence[Experience]) -> list[float]:
        """The rewards shaped by ``algorithm.overlong`` (each sample's action tokens, as the step counts them):
        what the running reward statistics take in, the same on every rank as on one."""
        raw = torch.tensor([float(e.reward) for e in experiences], dtype=torch.float32)
        actions = torch.tensor([float(len(e.response_token_ids) if e.action_mask is None else sum(e.action_mask))
                                for e in experiences], dtype=torch.float32)
        return [float(x) for x in self.algo_settings.overlong.shape_scores(raw, actions)]

    # ---- state ------------------------------------------------------------------------------------
    def extra_state(self) -> dict:
        return {"reward_stats": self.reward_stats.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.reward_stats.load_state_dict(state["reward_stats"])

    def engines(self) -> dict[str, TrainEngine]:
        return {**super().engines(), **({"critic": self.critic} if self.critic is not None else {})}

    def _save_more(self, out_dir: Path) -> None:
        if self.critic is not None:
            # gathered where the backend shards it (save_follower joins), under the inner model's names
            state = {k.removeprefix("inner."): v for k, v in self.critic.full_state_dict().items()}
            self.critic.model.save_pretrained(out_dir / "critic", state_dict=state, safe_serialization=True)
            self.critic.save_state(out_dir / "critic_optim")

    def _restore_more(self, in_dir: Path) -> None:
        if self.critic is not None:
            self.critic.load_state(in_dir / "critic_optim")

    # ---- the step -----------------------------------------------------------------------------------
    def _micro_batches(self, rows: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """``rows`` (batch positions) cut into forward/backward passes: by token budget when
        ``train.micro_batch_tokens`` is set (rows of similar length together), else ``micro_batch_size`` at a
        time. The loss is the same either way (its denominators are the mini-batch's)."""
        train = self.settings.train
        if train.micro_batch_tokens is None:
            groups = by_count(len(rows), train.micro_batch_size)
        else:
            groups = by_token_budget(lengths[rows].tolist(), train.micro_batch_tokens, train.micro_batch_size)
        return [rows[torch.tensor(g, dtype=torch.long, device=rows.device)] for g in groups]

    def _no_grad_pass(self, fn: Callable[[RLBatch], torch.Tensor], batch: RLBatch,
                      lengths: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
        """``fn`` over the batch's micro-batches, without gradients (``model``: the one ``fn`` runs, for the
        idle passes that keep a sharded backend's ranks in step)."""
        out = torch.zeros_like(batch.action_mask)
        chunks = self._micro_batches(torch.arange(batch.size, device=self.device), lengths)
        idle = extra_passes(len(chunks), self.actor.lockstep)
        with torch.no_grad():
            for idx in chunks:
                mb = batch.select(idx)
                out[idx, : mb.action_mask.shape[1]] = fn(mb).float()
            for _ in range(idle):
                idle_pass(model, self.device, backward=False)
        return out

    def _idle_no_grad_passes(self) -> None:
        """An empty shard's part in the no-grad passes of :meth:`train_step` (old log-probs, reference, values)."""
        models = [self.actor.runner, self.reference, self.critic.runner if self.critic is not None else None]
        for model in models:
            if model is not None:
                for _ in range(extra_passes(0, self.actor.lockstep)):
                    idle_pass(model, self.device, backward=False)

    def _idle_training_passes(self, count: int, train_actor: bool) -> None:
        """``count`` passes with a backward of zero through the models an update trains (sharded backends)."""
        for _ in range(count):
            if train_actor:
                idle_pass(self.actor.runner, self.device, backward=True)
            if self.critic is not None:
                idle_pass(self.critic.runner, self.device, backward=True)

    def _one_pass(self, chunks: list[torch.Tensor], lengths: torch.Tensor, train_actor: bool) -> bool:
        """True where a step is one update of one forward/backward over the whole batch on this rank,
        the actor alone and without dropout: then the old log-probs are that pass's own values, and a separate
        no-grad forward would compute the same numbers again."""
        a = self.algo_settings
        if self.actor.lockstep:  # ranks would differ in which passes they run (one fused, another not)
            return False
        if not (train_actor and a.ppo_epochs == 1 and len(chunks) == 1 and self.reference is None
                and self.critic is None and len(self._micro_batches(chunks[0], lengths)) == 1):
            return False
        if self._dropout_free is None:
            model = self.actor.model
            config = vars(getattr(model, "config", None) or object())
            rates = [v for k, v in config.items() if "dropout" in k and isinstance(v, (int, float))]
            self._dropout_free = all(r == 0 for r in rates) and not any(
                isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
        return self._dropout_free

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
        self._idle_no_grad_passes()
        if a.normalize_advantages:
            global_whiten(torch.zeros(1, 1, device=self.device), torch.zeros(1, 1, device=self.device))
        train_actor = self.global_step >= self.settings.train.freeze_actor_steps
        for _epoch in range(a.ppo_epochs):
            for _ in range(self._updates(total)):
                all_sum(torch.zeros(UPDATE_COUNTS, dtype=torch.float64, device=self.device))
                self._idle_training_passes(extra_passes(0, self.actor.lockstep), train_actor)
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

        The stages: prepare the batch (old / reference log-probs, values, KL, scores) -> advantages -> the loss
        mask (overlong kind, off-policy correction) -> the updates -> the metrics.
        """
        t0 = time.perf_counter()
        total = batch_samples if batch_samples is not None else len(experiences)
        if not experiences:
            return self._empty_step(total)
        batch = build_rl_batch(experiences, self.pad_id, self.temperature).to(self.device)
        lengths = batch.attention_mask.sum(-1)
        train_actor = self.global_step >= self.settings.train.freeze_actor_steps
        first_chunks = self._chunks(batch.size, total)  # epoch 0's mini-batches (drawn before any forward)
        fused = self._one_pass(first_chunks, lengths, train_actor)

        prepared = self._prepare(batch, lengths, fused, batch_scores)
        advantages, returns = self.algorithm.advantages(
            AdvantageInputs(scores=prepared.scores, groups=batch.groups, mask=batch.action_mask, kl=prepared.kl,
                            values=prepared.values, whiten=global_whiten))
        mask = loss_mask(batch.action_mask, batch.truncated, self.algo_settings.overlong, self.correction,
                         prepared.old_logprobs, batch.engine_logprobs)
        inputs = LossInputs(old_logprobs=prepared.old_logprobs, advantages=advantages, returns=returns, mask=mask,
                            reference_logprobs=prepared.reference_logprobs, values=prepared.values,
                            fused=prepared.fused)
        acc = self._train_updates(batch, lengths, first_chunks, total, train_actor, inputs)

        self.global_step += 1
        elapsed = time.perf_counter() - t0
        return {"step": float(self.global_step),
                **batch_metrics(batch, prepared, advantages, returns, mask),
                **self._run_metrics(experiences, batch, prepared, acc, train_actor, elapsed)}

    # ---- stage: prepare the batch -------------------------------------------------------------------
    def _prepare(self, batch: RLBatch, lengths: torch.Tensor, fused: bool,
                 batch_scores: Sequence[float] | None) -> PreparedBatch:
        """The no-grad forwards (or, ``fused``, the one training forward) and what follows from them."""
        a = self.algo_settings
        old_lp, pre = self._old_logprobs(batch, lengths, fused)
        ref_lp = None
        if (reference := self.reference) is not None:
            ref_lp = self._no_grad_pass(lambda mb: action_logprobs(reference, mb, mb.temperatures)[0], batch,
                                        lengths, reference)
        values = None
        if (critic := self.critic) is not None:
            critic.model.eval()
            values = self._no_grad_pass(lambda mb: action_values(critic.runner, mb), batch, lengths, critic.runner)
        return PreparedBatch(
            old_logprobs=old_lp, reference_logprobs=ref_lp, values=values, fused=pre,
            kl=step_kl(old_lp, ref_lp, a.kl.estimator, batch.action_mask),
            scores=step_scores(batch.scores, batch.action_mask.sum(-1), a.overlong, batch_scores,
                               self.reward_stats if a.normalize_rewards else None, a.reward_clip))

    def _old_logprobs(self, batch: RLBatch, lengths: torch.Tensor,
                      fused: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """The actor's log-probs before the step; ``fused``: also the training pass's log-probs and entropy."""
        actor = self.actor.runner  # the model, or the backend's engine that runs its forward (DeepSpeed)
        if not fused:
            actor.eval()
            return self._no_grad_pass(lambda mb: action_logprobs(actor, mb, mb.temperatures)[0], batch, lengths,
                                      actor), None
        # one update of one pass over the whole batch: the pass that trains gives the old log-probs too (its
        # values detached, as TRL does for one iteration) instead of a forward of its own before it
        actor.train()
        pre = action_logprobs(actor, batch, batch.temperatures, with_entropy=True,
                              entropy_grad=self.algo_settings.entropy_coef > 0)
        old_lp = torch.zeros_like(batch.action_mask)
        old_lp[:, : pre[0].shape[1]] = pre[0].detach().float()
        return old_lp, pre

    # ---- stage: the updates -------------------------------------------------------------------------
    def _train_updates(self, batch: RLBatch, lengths: torch.Tensor, first_chunks: list[torch.Tensor], total: int,
                       train_actor: bool, inputs: LossInputs) -> _Accumulator:
        """``ppo_epochs`` epochs of updates, one per mini-batch (epoch 0's: ``first_chunks``), each cut into
        passes; on a sharded backend padded with idle passes so every rank runs as many."""
        acc = _Accumulator()
        self.actor.model.train()
        if self.critic is not None:
            self.critic.model.train()
        for epoch in range(self.algo_settings.ppo_epochs):
            for rows in first_chunks if epoch == 0 else self._chunks(batch.size, total):
                counts = update_counts(inputs.mask.keep, batch.action_mask, rows)  # global: all ranks
                passes = self._micro_batches(rows, lengths)
                idle = extra_passes(len(passes), self.actor.lockstep)
                for idx in passes:
                    one = Pass(batch=batch.select(idx), rows=idx, counts=counts)
                    if train_actor:
                        self._actor_micro(one, inputs, acc)
                    if self.critic is not None:
                        self._critic_micro(one, inputs, acc)
                self._idle_training_passes(idle, train_actor)
                if train_actor:
                    acc.add("actor_grad_norm", self.actor.step(), per_update=True)
                if self.critic is not None:
                    acc.add("critic_grad_norm", self.critic.step(), per_update=True)
        return acc

    def _actor_micro(self, one: Pass, inputs: LossInputs, acc: _Accumulator) -> None:
        """One pass's actor loss and backward (the fused step's log-probs and entropy where it has them)."""
        a = self.algo_settings
        mb, cols, n_tok, n_seq = one.batch, one.cols, one.counts.tokens, one.counts.sequences
        if inputs.fused is not None:
            logp, entropy = cols(inputs.fused[0]), cols(inputs.fused[1])
        else:
            logp, entropy = action_logprobs(self.actor.runner, mb, mb.temperatures, with_entropy=True,
                                            entropy_grad=a.entropy_coef > 0)
        m = cols(inputs.mask.keep)
        out = self.policy_loss(PolicyLossInputs(logp=logp, old_logp=cols(inputs.old_logprobs),
                                                advantages=cols(inputs.advantages), mask=m,
                                                weights=cols(inputs.mask.weights)))
        pg_loss = aggregate(out.loss, m, self.loss_agg, n_tok, n_seq)
        loss = pg_loss
        ent = aggregate(entropy, m, self.loss_agg, n_tok, n_seq)
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * ent
        if self.algorithm.kl_loss_coef > 0 and inputs.reference_logprobs is not None:
            kl_loss = aggregate(kl_estimate(logp, cols(inputs.reference_logprobs), a.kl.estimator, m), m,
                                self.loss_agg, n_tok, n_seq)
            loss = loss + self.algorithm.kl_loss_coef * kl_loss
            acc.add("kl_loss", kl_loss)
        self.actor.backward(loss)
        acc.add("policy_loss", pg_loss)
        acc.add("entropy", ent)
        acc.count("clip_frac", (out.clipped * m).sum(), m.sum())
        acc.count("ratio_mean", (out.ratio * m).sum(), m.sum())

    def _critic_micro(self, one: Pass, inputs: LossInputs, acc: _Accumulator) -> None:
        """One pass's value loss and backward (over all action tokens, clipped around the values before the step)."""
        assert self.critic is not None and inputs.values is not None  # the critic's, computed in _prepare
        v = action_values(self.critic.runner, one.batch)
        vl = aggregate(value_loss(v, one.cols(inputs.values), one.cols(inputs.returns), self.algo_settings.value_clip),
                       one.batch.action_mask, self.algo_settings.loss_agg, one.counts.action_tokens,
                       one.counts.samples)
        self.critic.backward(vl)
        acc.add("value_loss", vl)

    # ---- stage: metrics -----------------------------------------------------------------------------
    def _run_metrics(self, experiences: Sequence[Experience], batch: RLBatch, prepared: PreparedBatch,
                     acc: _Accumulator, train_actor: bool, elapsed: float) -> dict[str, float]:
        """The step's numbers beside the batch's: sizes, speed, learning rates, the updates' losses."""
        tokens = int(batch.attention_mask.sum().item())
        metrics = {
            # multi-turn trajectories: response tokens the environment wrote (tool results, template), not trained
            "environment_tokens_mean": sum(len(e.response_token_ids) - sum(e.action_mask) for e in experiences
                                           if e.action_mask is not None) / len(experiences),
            "samples": float(batch.size),
            "tokens": float(tokens),
            "tokens_per_s": tokens * self.algo_settings.ppo_epochs / max(elapsed, 1e-9),
            "step_time_s": elapsed,
            "actor_lr": self.actor.lr(),
            "actor_frozen": float(not train_actor),
            **acc.means(),
        }
        if self.critic is not None:
            assert prepared.values is not None  # the critic's, computed in _prepare
            metrics["critic_lr"] = self.critic.lr()
            metrics["value_mean"] = float(masked_mean(prepared.values, batch.action_mask))
        return metrics


class _Accumulator:
    """Sums of per-micro-batch contributions (already normalised by mini-batch totals) per update. Values
    may be tensors: they are summed on the device and read once, at the end of the step (a ``.item()`` per
    micro-batch would be a GPU sync each)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor | float] = {}
        self.updates: dict[str, int] = {}
        self.ratios: dict[str, list] = {}

    def add(self, name: str, value: torch.Tensor | float, per_update: bool = False) -> None:
        value = value.detach() if isinstance(value, torch.Tensor) else value
        self.sums[name] = self.sums.get(name, 0.0) + value
        if per_update:
            self.updates[name] = self.updates.get(name, 0) + 1

    def count(self, name: str, num: torch.Tensor | float, den: torch.Tensor | float) -> None:
        n, d = self.ratios.get(name, [0.0, 0.0])
        num = num.detach() if isinstance(num, torch.Tensor) else num
        self.ratios[name] = [n + num, d + den]

    def means(self) -> dict[str, float]:
        n_updates = max(self.updates.values(), default=1)
        out = {k: float(v) / (self.updates.get(k) or n_updates) for k, v in self.sums.items()}
        out.update({k: float(n) / max(float(d), 1.0) for k, (n, d) in self.ratios.items()})
        return out
