"""The prefix cache's bookkeeping (pure, small tensors): longest-prefix lookup by blocks, LRU bound in tokens,
dominated entries, epochs; and the batch's prefill on top of cached prefixes equals a cold prefill."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from services.rollout.engines.hf.batch import KVBatch
from services.rollout.engines.hf.prefix_cache import BLOCK, PrefixCache
from services.rollout.engines.settings import HFEngineSettings


def kv(n: int, fill: float = 0.0):
    """One layer of fake KV for ``n`` positions whose values say their position (to check slicing)."""
    pos = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1) + fill
    return [(pos.clone(), -pos.clone())]


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_the_longest_shared_prefix_is_found_and_sliced_to_it():
    cache = PrefixCache(1000)
    a = ids(0, 40)
    assert cache.put(a, kv(40), cache.epoch)
    hit = cache.match(a + [7, 8, 9])
    assert hit is not None and hit.length == 40
    assert hit.kv[0][0].shape == (1, 1, 40, 1) and hit.kv[0][0][0, 0, -1, 0] == 39
    # a prompt that leaves the entry inside its third block: the match stops where the ids differ
    hit = cache.match(a[:37] + [999] * 10)
    assert hit is not None and hit.length == 37 and hit.kv[0][0].shape[2] == 37
    # the entry's whole ids as the prompt: one id is left to prefill (its logits are the first sample's)
    assert cache.match(a).length == 39
    # less than one block in common: no hit
    assert cache.match(a[: BLOCK - 1] + [999] * 30) is None
    assert cache.match([999] * 50) is None
    assert cache.stats.hits == 3 and cache.stats.lookups == 5


def test_the_bound_holds_least_recently_used_first_out():
    cache = PrefixCache(100)
    a, b, c = ids(0, 40), ids(1000, 40), ids(2000, 40)
    cache.put(a, kv(40), 0)
    cache.put(b, kv(40), 0)
    assert cache.match(a + [1]) is not None  # a is now the most recently used
    cache.put(c, kv(40), 0)  # 120 > 100: b goes
    assert cache.tokens == 80 <= cache.max_tokens and len(cache) == 2
    assert cache.match(b + [1]) is None and cache.match(a + [1]) is not None and cache.match(c + [1]) is not None
    assert cache.stats.evicted == 1
    assert not cache.put(ids(5000, 101), kv(101), 0)  # longer than the whole bound: not kept
    assert not cache.put(ids(5000, BLOCK - 1), kv(BLOCK - 1), 0)  # shorter than a block: not worth it
    cache.resize(40)
    assert cache.tokens <= 40 and len(cache) == 1


def test_an_entry_extended_by_a_newer_one_is_dropped_and_a_held_one_not_added_twice():
    cache = PrefixCache(1000)
    turn1 = ids(0, 40)
    turn2 = turn1 + ids(500, 30)
    cache.put(turn1, kv(40), 0)
    cache.put(turn2, kv(70), 0)
    assert len(cache) == 1 and cache.tokens == 70
    assert not cache.put(turn1, kv(40), 0)  # inside the newer one already
    assert not cache.put(turn2, kv(70), 0)
    assert len(cache) == 1


def test_an_older_epoch_is_never_kept_and_invalidate_empties():
    cache = PrefixCache(1000)
    epoch = cache.epoch
    cache.put(ids(0, 40), kv(40), epoch)
    cache.invalidate()
    assert len(cache) == 0 and cache.tokens == 0 and cache.match(ids(0, 41)) is None
    assert not cache.put(ids(0, 40), kv(40), epoch)  # admitted under the old weights
    assert cache.put(ids(0, 40), kv(40), cache.epoch)


def test_off_and_bad_settings():
    cache = PrefixCache(0)
    assert not cache.enabled and not cache.put(ids(0, 40), kv(40), 0) and cache.match(ids(0, 41)) is None
    assert HFEngineSettings().prefix_cache_tokens > 0  # on by default
    assert HFEngineSettings(prefix_cache_tokens=0).prefix_cache_tokens == 0
    with pytest.raises(ValidationError, match="use 0 \\(off\\) or >= 16"):
        HFEngineSettings(prefix_cache_tokens=8)


def alone(model, prompt):
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0, -1]


def test_prefill_on_cached_prefixes_of_different_lengths_equals_cold(model):
    """Rows with a long prefix, a short one, a partial match and none prefill in one pass: each row's logits,
    and the next decode step's, equal the prompt run alone (left pads, middle pads, positions, masks)."""
    cpu = torch.device("cpu")
    a, b = ids(5, 60), ids(100, 20)
    cache = PrefixCache(1000)
    with torch.inference_mode():
        warm = KVBatch(model)
        warm.prefill([a, b], 0, cpu)
        warm.step(torch.tensor([7, 8]))  # a + [7] and b + [8] are now in the cache
        for row, seq in ((0, a + [7]), (1, b + [8])):
            n, layers = warm.row_kv(row)
            assert n == len(seq)
            assert cache.put(seq, layers, 0)
        prompts = [a + [7, 9, 10], b + [8] + ids(200, 40), a[:40] + ids(240, 5), ids(150, 3)]
        hits = [cache.match(p) for p in prompts]
        assert [h and h.length for h in hits] == [61, 21, 40, None]
        batch = KVBatch(model)
        logits = batch.prefill(prompts, 0, cpu, hits)
        for i, p in enumerate(prompts):
            torch.testing.assert_close(logits[i], alone(model, p), atol=1e-5, rtol=0)
        step = batch.step(torch.tensor([1, 2, 3, 4]))
        for i, p in enumerate(prompts):
            torch.testing.assert_close(step[i], alone(model, p + [i + 1]), atol=1e-5, rtol=0)
        # the entries were not written through: a cold row still matches its own prefix exactly
        n, layers = warm.row_kv(0)
        torch.testing.assert_close(cache.match(a + [7, 1]).kv[0][0], layers[0][0])
