"""Per-row sampling over a batch of logits: temperature, top-k, top-p, min-p, per-row seeds.

Pure tensor functions, unit-tested. The logprob returned for a token is that of the distribution it
was sampled from: ``log_softmax(filtered_logits / temperature)`` (top-k / top-p / min-p removed
tokens get -inf and the rest renormalise); for greedy rows (temperature 0) ``log_softmax(logits)``.

A row's settings are checked once, when its sequence is submitted (:func:`row_params`,
:func:`row_generator`): whatever one request asks for, the batch tensors built from them cannot fail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

GREEDY_BELOW = 1e-5
"""Temperatures below this sample greedily, as vLLM and SGLang do (dividing by them overflows the logits)."""
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


@dataclass(frozen=True)
class RowParams:
    """One row's sampling settings, checked and normalised (see :func:`row_params`)."""

    temperature: float  # 0 = greedy
    top_k: int  # 0 = off, else 1..vocab
    top_p: float  # (0, 1]
    min_p: float  # [0, 1]


def _number(name: str, value: object, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        raise ValueError(f"{name}={value!r} is outside {'(' if lo_open else '['}{lo}, {hi}]")
    return v


def row_params(temperature: float, top_k: int, top_p: float, min_p: float, vocab: int) -> RowParams:
    """Check one row's settings (ValueError naming the bad one) and normalise them: a temperature below
    :data:`GREEDY_BELOW` is greedy, ``top_k <= 0`` is off and ``top_k`` over the vocabulary is the vocabulary."""
    t = _number("temperature", temperature, 0.0, _FLOAT32_MAX)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an integer, got {top_k!r}")
    return RowParams(
        temperature=0.0 if t < GREEDY_BELOW else t,
        top_k=0 if top_k <= 0 else min(top_k, vocab),
        top_p=_number("top_p", top_p, 0.0, 1.0, lo_open=True),
        min_p=_number("min_p", min_p, 0.0, 1.0),
    )


def row_generator(seed: int, device: torch.device) -> torch.Generator:
    """The row's own generator seeded with ``seed`` (ValueError when torch cannot take the seed)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed={seed!r} is not an integer torch can seed with (-2**63 .. 2**64-1)")
    gen = torch.Generator(device=device)
    try:
        gen.manual_seed(seed)
    except (RuntimeError, OverflowError) as exc:
        raise ValueError(f"seed={seed!r}: {exc}") from exc
    return gen


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

    @classmethod
    def of(cls, rows: Sequence[RowParams], generators: list[torch.Generator | None], device: torch.device) -> RowSampling:
        """The batch tensors of checked rows."""
        return cls(
            temperature=torch.tensor([r.temperature for r in rows], dtype=torch.float32, device=device),
            top_k=torch.tensor([r.top_k for r in rows], dtype=torch.long, device=device),
            top_p=torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=device),
            min_p=torch.tensor([r.min_p for r in rows], dtype=torch.float32, device=device),
            generators=generators,
        )


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


@dataclass
class Penalties:
    """One row's sampling penalties and what they read: the counts of its output tokens so far ``[V]`` and, for
    the repetition penalty, which tokens its prompt holds ``[V]`` (tensors on the logits' device)."""

    frequency: float
    presence: float
    repetition: float
    counts: torch.Tensor  # [V] float32
    prompt_seen: torch.Tensor | None  # [V] bool; None when repetition == 1

    @classmethod
    def of(cls, frequency: float, presence: float, repetition: float, prompt_ids: Sequence[int], vocab: int,
           device: torch.device) -> Penalties | None:
        """None when every penalty is neutral; ValueError when one is out of range (SGLang's and vLLM's bounds)."""
        frequency = _number("frequency_penalty", frequency, -2.0, 2.0)
        presence = _number("presence_penalty", presence, -2.0, 2.0)
        repetition = _number("repetition_penalty", repetition, 0.0, 2.0, lo_open=True)
        if frequency == 0.0 and presence == 0.0 and repetition == 1.0:
            return None
        seen = None
        if repetition != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            seen[torch.tensor(list(prompt_ids), dtype=torch.long, device=device)] = True
        return cls(frequency, presence, repetition, torch.zeros(vocab, dtype=torch.float32, device=device), seen)

    def add(self, token: int) -> None:
        self.counts[token] += 1


def penalised(logits: torch.Tensor, p: Penalties) -> torch.Tensor:
    """One row's logits ``[V]`` with its penalties applied, as vLLM applies them: the repetition penalty (CTRL's)
    divides the positive and multiplies the negative logits of tokens in the prompt or the output; then the
    frequency penalty subtracts ``frequency * count`` and the presence penalty ``presence`` from each token the
    output holds."""
    out = logits.float()
    if p.repetition != 1.0 and p.prompt_seen is not None:
        seen = p.prompt_seen | (p.counts > 0)
        out = torch.where(seen, torch.where(out > 0, out / p.repetition, out * p.repetition), out)
    if p.frequency or p.presence:
        out = out - p.frequency * p.counts - p.presence * (p.counts > 0).to(out.dtype)
    return out
