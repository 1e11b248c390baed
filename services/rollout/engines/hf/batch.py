"""The decode batch's tensors: a left-padded KV cache, its attention mask and per-row positions.

Rows join (their prompts prefilled separately, then merged, padding the shorter side on the left)
and leave (index-select) between decode steps: continuous batching on a plain ``DynamicCache``.
Left-pad columns no remaining row uses are trimmed after rows leave, so the cache stays compact.
Supports full-attention caches (Llama, Qwen, Mistral without sliding window, ...).

Newcomers may bring a cached prefix (:class:`~services.rollout.engines.hf.prefix_cache.PrefixHit`): only the
rest of their prompt is fed, on top of the prefix's keys / values. Rows with different prefix lengths
prefill together: each row is laid out as ``[pad][its prefix][pad][its suffix]`` — prefixes left-padded to
the longest one, suffixes left-padded to the longest one — with the mask 0 on every pad and position ids
counting only the row's own tokens, so each row sees exactly its own prompt at its own positions (the
cached keys were rotated at those positions when they were computed). Pads in the middle of a row are just
masked columns, like the left pads every row already has.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from services.rollout.engines.hf.prefix_cache import PrefixHit


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

    def prefill(self, prompts: list[list[int]], pad_id: int, device: torch.device,
                prefixes: list[PrefixHit | None] | None = None) -> torch.Tensor:
        """Run the prompts (left-padded) and append them as rows. Returns last-position logits [k, V].

        ``prefixes[i]``, when given, holds the KV of the first ``length`` ids of ``prompts[i]`` (fewer than all
        of them): only the rest is fed."""
        have = [0 if h is None else h.length for h in (prefixes or [None] * len(prompts))]
        past_width = max(have)
        suffixes = [p[n:] for p, n in zip(prompts, have)]
        width = max(len(p) for p in suffixes)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), past_width + width), dtype=torch.long)
        for i, p in enumerate(suffixes):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, past_width - have[i] : past_width] = 1
            mask[i, past_width + width - len(p) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)[:, past_width:]
        if past_width:
            cache = DynamicCache(ddp_cache_data=self._past(prefixes, past_width, device),
                                 config=self.model.config)
        else:
            cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        self._merge(out.past_key_values, mask, mask.sum(-1))
        return out.logits[:, -1, :]

    def _past(self, prefixes: list[PrefixHit | None], width: int, device: torch.device):
        """Per layer, the rows' cached prefixes left-padded to ``width`` (zeros where a row has none)."""
        shape = next(h for h in prefixes if h is not None).kv
        layers = []
        for layer, (k0, v0) in enumerate(shape):
            keys, values = [], []
            for h in prefixes:
                if h is None:
                    keys.append(k0.new_zeros((1, k0.shape[1], width, k0.shape[3]), device=device))
                    values.append(v0.new_zeros((1, v0.shape[1], width, v0.shape[3]), device=device))
                else:
                    k, v = h.kv[layer]
                    keys.append(_pad_left(k.to(device), width - h.length, 2))
                    values.append(_pad_left(v.to(device), width - h.length, 2))
            layers.append((torch.cat(keys, 0), torch.cat(values, 0)))
        return layers

    def row_kv(self, row: int) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Row ``row``'s own positions (pads dropped): their number and, per layer, compact copies of their
        keys and values ``[1, heads, n, dim]``."""
        cols = self.mask[row].nonzero().squeeze(-1)
        kv = [(layer.keys[row : row + 1].index_select(2, cols), layer.values[row : row + 1].index_select(2, cols))
              for layer in self.cache.layers]
        return int(cols.numel()), kv

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
