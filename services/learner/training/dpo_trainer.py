"""DPO updates of the policy on tokenised preference pairs, against a frozen reference (``model.reference``,
default the starting policy) or reference log-probabilities the pairs carry. Used offline (``algorithm: dpo``,
pairs from disk) and online (``online_dpo``, pairs picked from the fleet's groups: :mod:`.online_trainers`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from services.learner.algorithms.preference_losses import dpo_loss, preference_metrics
from services.learner.preference_data import PreferencePair, policy_ids
from services.learner.settings import LearnerSettings
from services.learner.training.base import TrainerBase
from services.learner.training.batch import SequenceBatch, action_logprobs, build_sequences
from services.learner.training.models import load_reference


@dataclass(frozen=True)
class TokenPair:
    """One pair as token ids: the prompt, the two responses (each ending with eos), and optionally the
    reference's summed log-probabilities of each response."""

    prompt: Sequence[int]
    chosen: Sequence[int]
    rejected: Sequence[int]
    ref_chosen: float | None = None
    ref_rejected: float | None = None


class DPOTrainer(TrainerBase):
    def __init__(self, settings: LearnerSettings, total_steps: int, resume_dir: Path | None = None,
                 local_rank: int = 0, pairs_per_step: int | None = None) -> None:
        self.dpo = settings.algorithm
        super().__init__(settings, total_steps, pairs_per_step or int(getattr(self.dpo, "batch_size", 1)), resume_dir,
                         local_rank)
        self.precomputed = getattr(self.dpo, "ref_chosen_key", None) is not None
        self.reference = None if self.precomputed else load_reference(settings.model, self.device)
        if resume_dir is not None:
            self.restore(resume_dir)

    def token_pair(self, pair: PreferencePair) -> TokenPair:
        prompt, chosen = policy_ids(self.tokenizer, pair.prompt, pair.chosen)
        _, rejected = policy_ids(self.tokenizer, pair.prompt, pair.rejected)
        return TokenPair(prompt, chosen, rejected, pair.ref_chosen, pair.ref_rejected)

    # ---- log-probabilities ------------------------------------------------------------------------
    def _batch(self, pairs: Sequence[TokenPair]) -> SequenceBatch:
        """Rows 0..P-1 the chosen sides, P..2P-1 the rejected ones."""
        prompts = [p.prompt for p in pairs] * 2
        responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
        return SequenceBatch(**build_sequences(prompts, responses, self.pad_id)).to(self.device)

    def _ref_logps(self, pairs: Sequence[TokenPair], batch: SequenceBatch) -> torch.Tensor:
        if self.reference is None:
            missing = [i for i, p in enumerate(pairs) if p.ref_chosen is None or p.ref_rejected is None]
            if missing:
                raise ValueError(f"pairs {missing[:5]} carry no reference log-probabilities (algorithm.ref_chosen_key)")
            return torch.tensor([p.ref_chosen for p in pairs] + [p.ref_rejected for p in pairs],
                                dtype=torch.float32, device=self.device)
        with torch.no_grad():
            return action_logprobs(self.reference, batch)[0].sum(-1)

    @torch.no_grad()
    def implicit_rewards(self, pairs: Sequence[TokenPair]) -> tuple[torch.Tensor, torch.Tensor]:
        """DPO's implicit rewards beta * log(pi / ref) of each side ``[P]`` (held-out evaluation)."""
        self.actor.model.eval()
        chosen, rejected = [], []
        micro = self.settings.train.micro_batch_size
        for start in range(0, len(pairs), micro):
            part = pairs[start: start + micro]
            batch = self._batch(part)
            ratio = (action_logprobs(self.actor.runner, batch)[0].sum(-1) - self._ref_logps(part, batch)).cpu()
            chosen.append(self.dpo.beta * ratio[: len(part)])
            rejected.append(self.dpo.beta * ratio[len(part):])
        return torch.cat(chosen), torch.cat(rejected)

    # ---- one step ---------------------------------------------------------------------------------
    def train_pairs(self, pairs: Sequence[TokenPair]) -> dict[str, float]:
        """One optimizer step of DPO over ``pairs`` (no pairs: the step counts, nothing is updated)."""
        t0 = time.perf_counter()
        if not pairs:
            self.global_step += 1
            return {"step": float(self.global_step), "pairs": 0.0, "step_time_s": time.perf_counter() - t0}
        self.actor.model.train()
        micro, a = self.settings.train.micro_batch_size, self.dpo
        total, sft_total, chosen_r, rejected_r, logps_c, logps_r, tokens = 0.0, 0.0, [], [], [], [], 0
        chosen_tokens = float(sum(len(p.chosen) for p in pairs))
        for start in range(0, len(pairs), micro):
            part = pairs[start: start + micro]
            batch = self._batch(part)
            tokens += int(batch.attention_mask.sum())
            ref = self._ref_logps(part, batch)
            logp = action_logprobs(self.actor.runner, batch)[0]
            seq = logp.sum(-1)
            n = len(part)
            out = dpo_loss(seq[:n], seq[n:], ref[:n], ref[n:], a.beta, a.loss, a.label_smoothing)
            loss = out.losses.sum() / len(pairs)
            if a.sft_coef:
                nll = -seq[:n].sum() / chosen_tokens
                loss = loss + a.sft_coef * nll
                sft_total += nll.item()
            self.actor.backward(loss)
            total += loss.item()
            chosen_r.append(out.chosen_rewards.cpu())
            rejected_r.append(out.rejected_rewards.cpu())
            logps_c.append(seq[:n].detach().cpu())
            logps_r.append(seq[n:].detach().cpu())
        grad_norm = self.actor.step()
        self.global_step += 1
        elapsed = time.perf_counter() - t0
        metrics = {"step": float(self.global_step), "loss": total, "actor_grad_norm": grad_norm,
                   "actor_lr": self.actor.lr(), "pairs": float(len(pairs)), "samples": float(2 * len(pairs)),
                   "tokens": float(tokens), "tokens_per_s": tokens / max(elapsed, 1e-9), "step_time_s": elapsed,
                   "logps/chosen": torch.cat(logps_c).mean().item(),
                   "logps/rejected": torch.cat(logps_r).mean().item(),
                   **preference_metrics(torch.cat(chosen_r), torch.cat(rejected_r))}
        if a.sft_coef:
            metrics["sft_loss"] = sft_total
        return metrics

    def pair_rewards(self, pairs: Sequence[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) implicit rewards of preference pairs (the held-out measure)."""
        return self.implicit_rewards([self.token_pair(p) for p in pairs])

    def train_step(self, pairs: Sequence[PreferencePair]) -> dict[str, float]:
        return self.train_pairs([self.token_pair(p) for p in pairs])
