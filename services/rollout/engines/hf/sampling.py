"""Per-row sampling over a batch of logits: temperature, top-k, top-p, min-p, per-row seeds.

Pure tensor functions, unit-tested. The logprob returned for a token is that of the distribution it
was sampled from: ``log_softmax(filtered_logits / temperature)`` (top-k / top-p / min-p removed
tokens get -inf and the rest renormalise); for greedy rows (temperature 0) ``log_softmax(logits)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """Sampling settings of the rows of a batch, as tensors on the logits' device."""

    temperature: torch.Tensor  # [B] float, 0 = greedy
    top_k: torch.Tensor  # [B] long, <= 0 = off
    top_p: torch.Tensor  # [B] float, 1 = off
    min_p: torch.Tensor  # [B] float, 0 = off
    generators: list[torch.Generator | None]  # per row; None = the engine's shared generator

    @property
    def needs_filter(self) -> bool:
        return bool((self.top_k > 0).any() or (self.top_p < 1).any() or (self.min_p > 0).any())


def filtered_logprobs(logits: torch.Tensor, rs: RowSampling) -> torch.Tensor:
    """[B, V] log-probabilities of the distribution each row samples from."""
    logits = logits.float()
    greedy = rs.temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(rs.temperature), rs.temperature).unsqueeze(-1)
    if rs.needs_filter:
        scaled = _filter(scaled, rs, skip=greedy)
    return torch.log_softmax(scaled, dim=-1)


def _filter(scaled: torch.Tensor, rs: RowSampling, skip: torch.Tensor) -> torch.Tensor:
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device).unsqueeze(0)
    k = torch.where(rs.top_k > 0, rs.top_k.clamp(max=vocab), torch.full_like(rs.top_k, vocab))
    remove = rank >= k.unsqueeze(-1)
    probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
    cum_before = probs.cumsum(dim=-1) - probs
    remove |= (cum_before > rs.top_p.unsqueeze(-1)) & (rs.top_p < 1).unsqueeze(-1)
    remove |= probs < (rs.min_p * probs[:, :1].squeeze(-1)).unsqueeze(-1)
    remove[:, 0] = False  # the most likely token always survives
    remove &= ~skip.unsqueeze(-1)
    mask = torch.zeros_like(remove).scatter(-1, order, remove)
    return scaled.masked_fill(mask, float("-inf"))


def sample(logits: torch.Tensor, rs: RowSampling, shared: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row. Returns (token ids [B], their logprobs [B], full logprobs [B, V])."""
    logprobs = filtered_logprobs(logits, rs)
    greedy = rs.temperature <= 0
    tokens = logprobs.argmax(dim=-1)
    if not bool(greedy.all()):
        probs = logprobs.exp()
        seeded = [i for i, g in enumerate(rs.generators) if g is not None and not bool(greedy[i])]
        free = [i for i, g in enumerate(rs.generators) if g is None and not bool(greedy[i])]
        for i in seeded:
            tokens[i] = torch.multinomial(probs[i], 1, generator=rs.generators[i])[0]
        if free:
            idx = torch.tensor(free, device=logits.device)
            tokens[idx] = torch.multinomial(probs[idx], 1, generator=shared).squeeze(-1)
    chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, chosen, logprobs
