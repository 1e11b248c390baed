"""The decode batch's tensors: a left-padded KV cache, its attention mask and per-row positions.

Rows join (their prompts prefilled separately, then merged, padding the shorter side on the left)
and leave (index-select) between decode steps: continuous batching on a plain ``DynamicCache``.
Left-pad columns no remaining row uses are trimmed after rows leave, so the cache stays compact.
Supports full-attention caches (Llama, Qwen, Mistral without sliding window, ...).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def _pad_left(t: torch.Tensor, extra: int, dim: int) -> torch.Tensor:
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class KVBatch:
    """Cache + attention mask [B, L] + next position per row [B]."""

    def __init__(self, model) -> None:
        self.model = model
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    def prefill(self, prompts: list[list[int]], pad_id: int, device: torch.device) -> torch.Tensor:
        """Run the prompts (left-padded) and append them as rows. Returns last-position logits [k, V]."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        self._merge(out.past_key_values, mask, mask.sum(-1))
        return out.logits[:, -1, :]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row [B]; returns next-token logits [B, V]."""
        assert self.mask is not None and self.positions is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.size, 1))], dim=1)
        out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=self.mask,
                         position_ids=self.positions.unsqueeze(-1), past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        self.positions = self.positions + 1
        return out.logits[:, -1, :]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); trims left-pad columns nobody needs any more."""
        if not rows:
            self.cache = self.mask = self.positions = None
            return
        if rows == list(range(self.size)):
            return
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask.index_select(0, idx)
        self.positions = self.positions.index_select(0, idx)
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if used.numel() else 0
        self.mask = self.mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, start:]
            layer.values = layer.values.index_select(0, idx)[:, :, start:]

    def _merge(self, cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor) -> None:
        if self.cache is None:
            self.cache, self.mask, self.positions = cache, mask, positions
            return
        old_len, new_len = self.mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        layers = []
        for old, new in zip(self.cache.layers, cache.layers):
            keys = torch.cat([_pad_left(old.keys, width - old_len, 2), _pad_left(new.keys, width - new_len, 2)], 0)
            values = torch.cat([_pad_left(old.values, width - old_len, 2), _pad_left(new.values, width - new_len, 2)], 0)
            layers.append((keys, values))
        self.cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)
        self.mask = torch.cat([_pad_left(self.mask, width - old_len, 1), _pad_left(mask, width - new_len, 1)], 0)
        self.positions = torch.cat([self.positions, positions], 0)
