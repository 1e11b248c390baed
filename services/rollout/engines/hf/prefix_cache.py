"""The hf engine's prefix cache: the KV of recently finished sequences, reused by prompts that start with them.

A multi-turn rollout sends, every turn, the previous turn's prompt + output + the environment's reply: without
this cache the engine prefills the whole grown context each turn. When a sequence leaves the decode batch, its
ids (prompt + the output tokens already fed through the model) and their keys / values are kept here; a new
prompt that shares a prefix with an entry prefills only the rest, on top of a copy of that prefix's KV.

- **Lookup** is by blocks of :data:`BLOCK` tokens: each entry is indexed under the chained hash of every
  whole block of its ids, so a prompt finds the entry sharing its longest block-aligned prefix in one dict
  probe per block, then the match is extended token by token into the next block. Hits shorter than one block
  are not worth a batch layout of their own and are not made. A match is checked id by id before it is used
  (hashes may collide), and it always leaves at least one prompt token to prefill (its logits are the first
  sample's).
- **Bounds**: ``max_tokens`` ids (the KV of that many positions) in all, least recently used evicted first;
  an entry that is a prefix of a newer one is dropped (the newer one serves every prompt it served).
- **Weights**: an entry is reusable only under the weights that computed it. :meth:`invalidate` (the engine
  calls it when its weight version is set and when generation resumes after a pause, the only window in which
  weights change) drops every entry and starts a new epoch; a sequence admitted in an older epoch is never
  inserted (:meth:`put` takes the epoch it was admitted in).

Tensors are never written in place: entries hold their own compact copies ``[1, heads, length, dim]`` per
layer, and a hit's prefix is copied into the batch (``torch.cat``), so entries and batch never alias.

Thread-safe (one lock): the decode thread looks up and inserts, the event loop invalidates.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

BLOCK = 16
"""Granularity of the lookup index, and the shortest hit made (in tokens)."""

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, length, dim]


@dataclass(eq=False)
class _Entry:
    key: int
    ids: tuple[int, ...]
    kv: KV
    blocks: list[int]  # chained hashes of its whole blocks, the index keys it is filed under


@dataclass(frozen=True)
class PrefixHit:
    """``length`` leading prompt ids whose KV is ``kv`` (per layer, ``[1, heads, length, dim]``, views of the
    entry's tensors: copy before writing)."""

    length: int
    kv: KV


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0  # prompt tokens not prefilled thanks to the cache
    prompt_tokens: int = 0  # prompt tokens of the sequences looked up
    inserted: int = 0
    evicted: int = 0
    invalidations: int = 0


def _chain(ids: Sequence[int], blocks: int) -> list[int]:
    """Chained hashes of the first ``blocks`` whole blocks of ``ids``."""
    out, h = [], 0
    for b in range(blocks):
        h = hash((h, tuple(ids[b * BLOCK : (b + 1) * BLOCK])))
        out.append(h)
    return out


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU order, oldest first
        self._index: dict[int, dict[int, _Entry]] = {}  # block hash -> the entries holding that block
        self._ends: dict[int, dict[int, _Entry]] = {}  # hash of an entry's last whole block -> the entries
        self._keys = itertools.count()
        self._tokens = 0
        self.epoch = 0
        self.stats = PrefixCacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_tokens >= BLOCK

    @property
    def tokens(self) -> int:
        """Token positions held (the bound is ``max_tokens``)."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._entries)

    # ---- lookup --------------------------------------------------------------------------------------
    def match(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest cached prefix of ``prompt`` (at least :data:`BLOCK` ids, at most ``len(prompt) - 1``)."""
        if not self.enabled:
            return None
        usable = len(prompt) - 1
        hashes = _chain(prompt, usable // BLOCK)
        with self._lock:
            self.stats.lookups += 1
            self.stats.prompt_tokens += len(prompt)
            found: dict[int, _Entry] | None = None
            for h in hashes:
                nxt = self._index.get(h)
                if not nxt:
                    break
                found = nxt
            if not found:
                return None
            best, best_len = None, 0
            for entry in found.values():
                n = self._common(entry.ids, prompt, usable)
                if n > best_len:
                    best, best_len = entry, n
            if best is None or best_len < BLOCK:
                return None
            self._entries.move_to_end(best.key)
            self.stats.hits += 1
            self.stats.hit_tokens += best_len
            return PrefixHit(best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in best.kv])

    @staticmethod
    def _common(ids: tuple[int, ...], prompt: Sequence[int], usable: int) -> int:
        """Length of the common prefix of ``ids`` and ``prompt`` (capped at ``usable``), found from the
        block-aligned part (checked whole: hashes may collide) and extended id by id."""
        limit = min(len(ids), usable)
        n = (limit // BLOCK) * BLOCK
        while n > 0 and tuple(prompt[:n]) != ids[:n]:  # a collision, or a shorter shared part: step back
            n -= BLOCK
        while n < limit and ids[n] == prompt[n]:
            n += 1
        return n

    # ---- insert / evict ------------------------------------------------------------------------------
    def put(self, ids: Sequence[int], kv: KV, epoch: int) -> bool:
        """Keep ``kv`` (per layer ``[1, heads, len(ids), dim]``, owned by the cache from now on) as the KV of
        ``ids``, computed by a sequence admitted in ``epoch``. False when it is not kept (cache off, too
        short or too long, an older epoch, already held)."""
        n = len(ids)
        if not self.enabled or n < BLOCK or n > self.max_tokens:
            return False
        ids = tuple(ids)
        blocks = _chain(ids, n // BLOCK)
        with self._lock:
            if epoch != self.epoch:
                return False
            for entry in list(self._index.get(blocks[-1], {}).values()):
                if len(entry.ids) >= n and entry.ids[:n] == ids:  # held already (as it is, or inside a longer one)
                    self._entries.move_to_end(entry.key)
                    return False
            for h in blocks:  # entries that are prefixes of this one are served by it from now on
                for entry in list(self._ends.get(h, {}).values()):
                    if len(entry.ids) < n and ids[: len(entry.ids)] == entry.ids:
                        self._drop(entry)
            entry = _Entry(next(self._keys), ids, kv, blocks)
            self._entries[entry.key] = entry
            for h in blocks:
                self._index.setdefault(h, {})[entry.key] = entry
            self._ends.setdefault(blocks[-1], {})[entry.key] = entry
            self._tokens += n
            self.stats.inserted += 1
            while self._tokens > self.max_tokens:
                self._drop(next(iter(self._entries.values())))
                self.stats.evicted += 1
            return True

    def _drop(self, entry: _Entry) -> None:
        del self._entries[entry.key]
        self._tokens -= len(entry.ids)
        for index, hashes in ((self._index, entry.blocks), (self._ends, entry.blocks[-1:])):
            for h in hashes:
                filed = index.get(h)
                if filed is not None:
                    filed.pop(entry.key, None)
                    if not filed:
                        del index[h]

    def resize(self, max_tokens: int) -> None:
        """A new bound (0 = off); the least recently used entries go until it holds."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        with self._lock:
            self.max_tokens = max_tokens
            while self._entries and self._tokens > max_tokens:
                self._drop(next(iter(self._entries.values())))
                self.stats.evicted += 1

    def invalidate(self) -> None:
        """Drop every entry and start a new epoch (the weights changed, or may have)."""
        with self._lock:
            self._entries.clear()
            self._index.clear()
            self._ends.clear()
            self._tokens = 0
            self.epoch += 1
            self.stats.invalidations += 1
