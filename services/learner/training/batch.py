"""Tensors for training, built from Experience records (or prompt/answer pairs for SFT).

Each sample is ``prompt_token_ids + response_token_ids``, right-padded to the longest in the batch.
Response-aligned tensors are ``[B, R]`` (R = longest response): ``action_pos[b, j]`` is the position
whose logits predict response token ``j`` (``len(prompt) - 1 + j``) and ``action_mask`` is 1 for
real response tokens. Algorithms only ever see these response-aligned tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Literal, overload

import numpy as np
import torch
from torch import nn

from services.learner.algorithms.loss_terms import entropy_from_logits
from shared.schemas import Experience

if TYPE_CHECKING:
    from typing_extensions import Self


@dataclass(frozen=True)
class SequenceBatch:
    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long
    action_pos: torch.Tensor  # [B, R] long
    response_ids: torch.Tensor  # [B, R] long
    action_mask: torch.Tensor  # [B, R] float

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def num_tokens(self) -> int:
        return int(self.attention_mask.sum().item())

    def select(self, idx: torch.Tensor) -> Self:
        """The rows ``idx`` of every tensor (trimmed to the longest selected sequence)."""
        picked = {f.name: _take(getattr(self, f.name), idx) for f in fields(self)}
        out = replace(self, **picked)
        return out.trimmed()

    def trimmed(self) -> Self:
        """Drop columns that are padding in every row (shorter micro-batches run faster)."""
        seq_len = int(self.attention_mask.sum(-1).max().item()) if self.size else 0
        # up to the last action column of any row: a multi-turn trajectory's mask has holes (environment turns),
        # so its sum is not its length
        actions = self.action_mask.any(0).nonzero() if self.size else None
        resp_len = int(actions[-1].item()) + 1 if actions is not None and actions.numel() else 0
        changes = {}
        for f in fields(self):
            t = getattr(self, f.name)
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                continue
            if f.name in ("input_ids", "attention_mask"):
                changes[f.name] = t[:, : max(seq_len, 1)]
            else:
                changes[f.name] = t[:, : max(resp_len, 1)]
        return replace(self, **changes)

    def to(self, device: torch.device) -> Self:
        return replace(self, **{f.name: _to(getattr(self, f.name), device) for f in fields(self)})


@dataclass(frozen=True)
class RLBatch(SequenceBatch):
    engine_logprobs: torch.Tensor  # [B, R] float: the sampler's logprobs of the response tokens
    scores: torch.Tensor  # [B] float: scalar rewards
    groups: torch.Tensor  # [B] long: group label
    temperatures: torch.Tensor  # [B] float: the temperature each sample was sampled with (greedy: 1)
    truncated: torch.Tensor  # [B] bool: cut by the length limit (finish reason "length")


def _take(x, idx: torch.Tensor):
    return x.index_select(0, idx.to(x.device)) if isinstance(x, torch.Tensor) else x


def _to(x, device: torch.device):
    return x.to(device) if isinstance(x, torch.Tensor) else x


def build_sequences(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int) -> dict:
    """Right-padded input_ids / attention_mask and response-aligned action tensors."""
    n = len(prompts)
    p_lens = np.array([len(p) for p in prompts], dtype=np.int64)
    r_lens = np.array([len(r) for r in responses], dtype=np.int64)
    if n == 0 or (p_lens < 1).any():
        raise ValueError("every sample needs at least one prompt token")
    seq_len = int((p_lens + r_lens).max())
    resp_len = max(int(r_lens.max()), 1)
    input_ids = np.full((n, seq_len), pad_id, dtype=np.int64)
    attention = np.zeros((n, seq_len), dtype=np.int64)
    response_ids = np.full((n, resp_len), pad_id, dtype=np.int64)
    action_pos = np.zeros((n, resp_len), dtype=np.int64)
    action_mask = np.zeros((n, resp_len), dtype=np.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_arr, r_arr = np.asarray(p, dtype=np.int64), np.asarray(r, dtype=np.int64)
        lp, lr = len(p_arr), len(r_arr)
        input_ids[i, :lp] = p_arr
        input_ids[i, lp : lp + lr] = r_arr
        attention[i, : lp + lr] = 1
        response_ids[i, :lr] = r_arr
        action_pos[i, :lr] = np.arange(lp - 1, lp - 1 + lr)
        action_mask[i, :lr] = 1.0
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention),
        "action_pos": torch.from_numpy(action_pos),
        "response_ids": torch.from_numpy(response_ids),
        "action_mask": torch.from_numpy(action_mask),
    }


def build_rl_batch(experiences: Sequence[Experience], pad_id: int, temperature: float = 1.0) -> RLBatch:
    """An RLBatch from experiences; samples of one ``group_id`` share a group label.

    Each sample's logprobs are scored at the temperature it was sampled with (``Experience.sampling``; records
    that do not say use ``temperature``); greedy samples (0) at 1, the untempered policy. Environment tokens
    of a multi-turn trajectory (``action_mask`` 0) are context, not actions: they leave the action mask."""
    seq = build_sequences([e.prompt_token_ids for e in experiences], [e.response_token_ids for e in experiences],
                          pad_id)
    resp_len = seq["response_ids"].shape[1]
    engine_lp = np.zeros((len(experiences), resp_len), dtype=np.float32)
    for i, e in enumerate(experiences):
        lp = np.asarray(e.response_logprobs, dtype=np.float32)
        engine_lp[i, : len(lp)] = lp
        if e.action_mask is not None:
            seq["action_mask"][i, : len(lp)] *= torch.from_numpy(np.asarray(e.action_mask, dtype=np.float32))
    labels: dict[str, int] = {}
    groups = [labels.setdefault(e.group_id, len(labels)) for e in experiences]
    temps = [(e.sampling.temperature if e.sampling is not None else temperature) or 1.0 for e in experiences]
    return RLBatch(
        **seq,
        engine_logprobs=torch.from_numpy(engine_lp),
        scores=torch.tensor([float(e.reward) for e in experiences], dtype=torch.float32),
        groups=torch.tensor(groups, dtype=torch.long),
        temperatures=torch.tensor(temps, dtype=torch.float32),
        truncated=torch.tensor([e.finish_reason == "length" for e in experiences], dtype=torch.bool),
    )


@overload
def action_logprobs(
    model: nn.Module, batch: SequenceBatch, temperature: float | torch.Tensor = 1.0, *, with_entropy: Literal[True],
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def action_logprobs(
    model: nn.Module, batch: SequenceBatch, temperature: float | torch.Tensor = 1.0, with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]: ...
def action_logprobs(
    model: nn.Module, batch: SequenceBatch, temperature: float | torch.Tensor = 1.0, with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities ``[B, R]`` of the response tokens under ``model`` (and the entropy if asked).

    Logits are divided by the sampling temperature (one for the batch, or ``[B]``, one per sample) so that
    the learner's probabilities match the distribution the engine sampled from.
    """
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    vocab = logits.shape[-1]
    idx = batch.action_pos.unsqueeze(-1).expand(-1, -1, vocab)
    act_logits = logits.gather(1, idx).float()
    if isinstance(temperature, torch.Tensor):
        if not bool((temperature == 1.0).all()):
            act_logits = act_logits / temperature.to(act_logits.device, act_logits.dtype).view(-1, 1, 1)
    elif temperature != 1.0:
        act_logits = act_logits / temperature
    logp = torch.log_softmax(act_logits, dim=-1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:  # without a gradient unless an entropy bonus trains on it
        entropy = entropy_from_logits(act_logits if entropy_grad else act_logits.detach())
    return logp * batch.action_mask, entropy


def action_values(critic: nn.Module, batch: SequenceBatch) -> torch.Tensor:
    """Critic values ``[B, R]`` of the states before each response token."""
    values = critic(batch.input_ids, batch.attention_mask)  # [B, L]
    return values.gather(1, batch.action_pos) * batch.action_mask
