"""The decode batch's tensors: per layer, a key and a value buffer with one slot per row, written in place.

Layout: each layer's keys (and values) live in one buffer ``[rows, kv_heads, columns, head_dim]`` allocated with
room to spare. Row ``b`` holds its own tokens at columns ``0 .. len_b - 1`` (a token's column is its position);
the rest of its slot is free. A decode step writes each row's new key / value at its own column ``len_b``, in
place, and attends over columns ``0 .. max(len)`` through a 4D mask (column ``j`` is visible to a row's query at
column ``c`` iff ``j <= c``): rows of different lengths share a batch without being shifted, and no step copies
the cache (a ``DynamicCache`` concatenates it every step). Newcomers are prefilled straight into the free slots
after the running rows (nothing of the running rows is copied when they join), and when rows leave, only the
rows behind them move up (their used columns). Buffers grow when a pass needs more rows or columns (rows
doubled, columns by half again, rounded up to :data:`COLUMNS_STEP`), shrink when the batch needs a quarter of
them, and are dropped when the batch empties unless small (:data:`RETAINED_POSITIONS`). Supports full-attention
caches (Llama, Qwen, Mistral without sliding window, ...) with the ``sdpa`` or ``eager`` attention implementations (they take a 4D mask).

Newcomers may bring a cached prefix (:class:`~services.rollout.engines.hf.prefix_cache.PrefixHit`): its keys /
values are copied into the row's slot (columns ``0 .. length - 1``) and only the rest of its prompt is fed. The
fed suffixes are left-padded to the longest one, so the pass's last position is every row's last prompt token;
a real token is written at its column, a pad beyond the row's end (free columns, overwritten by its next tokens)
and a pad's query sees column 0 only. Each row thus sees exactly its own prompt at its own positions (the cached
keys were rotated at those positions when they were computed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from services.rollout.engines.hf.prefix_cache import PrefixHit

COLUMNS_STEP = 128
"""Column capacity is a multiple of this."""

RETAINED_POSITIONS = 64 * 1024
"""A batch that empties keeps its buffers for the next one while they hold at most this many row x column
positions (zeroing fresh ones took 4.8 ms of a 39 ms round of 64 short rows on CPU); bigger ones are freed. What the
old rows left in them is never attended: a row's columns are written before its mask lets a query see them."""


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclass
class _Pass:
    """Where one forward pass writes (rows x fed positions -> slot, column) and what it attends over."""

    slots: torch.Tensor  # [n, 1] the rows' slots
    columns: torch.Tensor  # [n, S] the column each fed position is written at
    rows: slice  # the slots the pass attends with (contiguous)
    width: int  # columns attended over
    seen: int  # the longest cached part of a row before this pass (what get_seq_length answers)
    prefixes: list[tuple[int, PrefixHit]]  # (slot, hit): copied into the slot before the pass's own writes


class _PassCache(Cache):
    """The cache a forward pass gets: its keys / values go into the batch's buffers (see :class:`KVBatch`)."""

    def __init__(self, batch: KVBatch, write: _Pass) -> None:
        try:
            super().__init__(layers=[])  # no layers of its own: update() writes into the batch's buffers
        except TypeError:  # a transformers whose Cache takes no layers
            super().__init__()
        self.batch = batch
        self.write = write

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.batch._write(layer_idx, key_states, value_states, self.write)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.write.seen

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.write.width, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.write.seen

    @property
    def is_compileable(self) -> bool:
        return False


class KVBatch:
    """Per-layer key / value buffers, one slot per row (rows ``0 .. size - 1`` in use) + each row's length."""

    def __init__(self, model) -> None:
        self.model = model
        self.keys: list[torch.Tensor] = []  # per layer [row capacity, kv heads, column capacity, head dim]
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # per row: its positions held (its next token's column)
        self.row_capacity = 0
        self.column_capacity = 0
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
        self._bool_mask = impl == "sdpa"  # sdpa takes a boolean mask; eager adds a float one to its scores

    @property
    def size(self) -> int:
        return len(self.lengths)

    # ---- passes --------------------------------------------------------------------------------------
    def prefill(self, prompts: list[list[int]], pad_id: int, device: torch.device,
                prefixes: list[PrefixHit | None] | None = None) -> torch.Tensor:
        """Run the prompts and append them as rows. Returns last-position logits [k, V].

        ``prefixes[i]``, when given, holds the KV of the first ``length`` ids of ``prompts[i]`` (fewer than all
        of them): only the rest is fed. Rows with the same prompt (the ``n`` samples of a group) share one pass
        row: each distinct prompt is fed once and its keys / values are copied to the others' slots (their
        logits and KV are the same computation, so this changes nothing but the cost)."""
        hits = list(prefixes or [None] * len(prompts))
        first, k = self.size, len(prompts)
        source: list[int] = []  # per row: its distinct prompt's index
        index: dict[tuple, int] = {}
        for p, h in zip(prompts, hits):
            source.append(index.setdefault((tuple(p), id(h) if h is not None else None), len(index)))
        if len(index) == k:
            return self._prefill_rows(prompts, hits, pad_id, device)
        distinct = [0] * len(index)
        for i, u in enumerate(source):
            distinct[u] = i
        logits = self._prefill_rows([prompts[i] for i in distinct], [hits[i] for i in distinct], pad_id, device)
        ends = [len(p) for p in prompts]
        try:
            self._reserve(first + k, max(ends) + 1)
            src = torch.tensor(source, dtype=torch.long, device=self.keys[0].device) + first
            used = max(ends)
            for buffers in (self.keys, self.values):
                for buf in buffers:  # the right side is gathered first: overlapping slots are safe
                    buf[first:first + k, :, :used] = buf[src, :, :used]
        except BaseException:
            del self.lengths[first:]  # as before the call: the caller may prefill the rows again, one by one
            raise
        self.lengths[first:] = ends
        return logits[torch.tensor(source, dtype=torch.long, device=logits.device)]

    def _prefill_rows(self, prompts: list[list[int]], hits: list[PrefixHit | None], pad_id: int,
                      device: torch.device) -> torch.Tensor:
        """:meth:`prefill`, one pass row per prompt."""
        have = [0 if h is None else h.length for h in hits]
        suffixes = [p[n:] for p, n in zip(prompts, have)]
        width = max(len(s) for s in suffixes)
        k, first = len(prompts), self.size
        ends = [len(p) for p in prompts]
        ids = torch.full((k, width), pad_id, dtype=torch.long)
        cols = torch.empty((k, width), dtype=torch.long)
        query = torch.zeros((k, width), dtype=torch.long)  # the column each position's query sits at (pads: 0)
        for i, s in enumerate(suffixes):
            pad = width - len(s)
            ids[i, pad:] = torch.tensor(s, dtype=torch.long)
            cols[i, :pad] = torch.arange(ends[i], ends[i] + pad)  # free columns past the row's end
            cols[i, pad:] = query[i, pad:] = torch.arange(have[i], ends[i])
        self._reserve(first + k, max(e + width for e in ends))
        attend = max(ends)
        mask = torch.arange(attend).view(1, 1, attend) <= query.unsqueeze(-1)
        ids, cols, query, mask = ids.to(device), cols.to(device), query.to(device), mask.to(device)
        write = _Pass(slots=torch.arange(first, first + k, device=device).unsqueeze(-1), columns=cols,
                      rows=slice(first, first + k), width=attend, seen=max(have),
                      prefixes=[(first + i, h) for i, h in enumerate(hits) if h is not None])
        out = self.model(input_ids=ids, attention_mask=self._mask(mask.unsqueeze(1)), position_ids=query,
                         past_key_values=_PassCache(self, write), use_cache=True, logits_to_keep=1)
        self.lengths.extend(ends)
        return out.logits[:, -1, :]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row [B]; returns next-token logits [B, V]."""
        assert self.size and tokens.shape[0] == self.size
        device = tokens.device
        width = max(self.lengths) + 1
        self._reserve(self.size, width)
        at = torch.tensor(self.lengths, dtype=torch.long, device=device).unsqueeze(-1)  # [B, 1]
        mask = torch.arange(width, device=device).view(1, width) <= at  # [B, W]
        write = _Pass(slots=torch.arange(self.size, device=device).unsqueeze(-1), columns=at,
                      rows=slice(0, self.size), width=width, seen=width - 1, prefixes=[])
        # rows all as long: every column is every row's, no mask (sdpa's fastest path: one query sees all keys)
        uniform = self.lengths.count(self.lengths[0]) == self.size
        out = self.model(input_ids=tokens.unsqueeze(-1),
                         attention_mask=None if uniform else self._mask(mask.view(self.size, 1, 1, width)),
                         position_ids=at, past_key_values=_PassCache(self, write), use_cache=True)
        self.lengths = [n + 1 for n in self.lengths]
        return out.logits[:, -1, :]

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        if self._bool_mask:
            return allowed
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)

    def _write(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor,
               write: _Pass) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's update in a pass: its new keys / values [n, heads, S, dim] into the slots' columns; returns
        the slots' columns ``0 .. width - 1``."""
        if layer == len(self.keys):  # the first pass since the buffers were dropped
            heads, dim = key_states.shape[1], key_states.shape[3]
            shape = (self.row_capacity, heads, self.column_capacity, dim)
            self.keys.append(key_states.new_zeros(shape))
            self.values.append(value_states.new_zeros((*shape[:3], value_states.shape[3])))
        keys, values = self.keys[layer], self.values[layer]
        for slot, hit in write.prefixes:
            k, v = hit.kv[layer]
            keys[slot, :, : hit.length] = k[0]
            values[slot, :, : hit.length] = v[0]
        keys.transpose(1, 2)[write.slots, write.columns] = key_states.transpose(1, 2)
        values.transpose(1, 2)[write.slots, write.columns] = value_states.transpose(1, 2)
        return keys[write.rows, :, : write.width], values[write.rows, :, : write.width]

    # ---- capacity ------------------------------------------------------------------------------------
    def _reserve(self, rows: int, columns: int) -> None:
        """Room for ``rows`` slots of ``columns`` columns (buffers grown, their rows in use copied over)."""
        if rows <= self.row_capacity and columns <= self.column_capacity:
            return
        new_rows = max(rows, 2 * self.row_capacity) if rows > self.row_capacity else self.row_capacity
        new_columns = (_round_up(max(columns, self.column_capacity * 3 // 2), COLUMNS_STEP)
                       if columns > self.column_capacity else self.column_capacity)
        self._resize(new_rows, new_columns)

    def _resize(self, rows: int, columns: int) -> None:
        used = max(self.lengths, default=0)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = old.new_zeros((rows, old.shape[1], columns, old.shape[3]))
                new[: self.size, :, :used] = old[: self.size, :, :used]
                buffers[i] = new
        self.row_capacity, self.column_capacity = rows, columns

    # ---- rows leaving / kept -------------------------------------------------------------------------
    def row_kv(self, row: int) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Row ``row``'s positions: their number and, per layer, compact copies of their keys and values
        ``[1, heads, n, dim]``."""
        n = self.lengths[row]
        kv = [(k[row : row + 1, :, :n].clone(memory_format=torch.contiguous_format),
               v[row : row + 1, :, :n].clone(memory_format=torch.contiguous_format))
              for k, v in zip(self.keys, self.values)]
        return n, kv

    def drop(self) -> None:
        """Empty, with the buffers freed."""
        self.keys, self.values, self.lengths = [], [], []
        self.row_capacity = self.column_capacity = 0

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order, as slots ``0 .. len(rows) - 1``)."""
        if not rows:
            self.lengths = []
            if self.row_capacity * self.column_capacity > RETAINED_POSITIONS:
                self.drop()
            return
        if rows == list(range(self.size)):
            return
        moves = [(dst, src) for dst, src in enumerate(rows) if dst != src]
        if moves:
            used = max(self.lengths[src] for _, src in moves)
            device = self.keys[0].device if self.keys else torch.device("cpu")
            dst = torch.tensor([d for d, _ in moves], dtype=torch.long, device=device)
            src = torch.tensor([s for _, s in moves], dtype=torch.long, device=device)
            for buffers in (self.keys, self.values):
                for buf in buffers:
                    buf[dst, :, :used] = buf[src, :, :used]  # the right side is gathered first: overlaps are safe
        self.lengths = [self.lengths[i] for i in rows]
        need = max(self.lengths) + 1
        if self.column_capacity > COLUMNS_STEP and 4 * need < self.column_capacity:
            self._resize(self.row_capacity, _round_up(2 * need, COLUMNS_STEP))
