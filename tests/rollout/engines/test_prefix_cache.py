"""The hf engine's prefix cache in-process: a turn that extends the previous one prefills only its new tokens, and
what it generates (ids, logprobs) equals an engine without the cache; weights that change are never mixed with
a prefix computed by others; aborted and interrupted sequences, bounds and the off switch."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.rollout.engines.types import SamplingParams
from tests.rollout.engines.conftest import make_engine
from tests.rollout.engines.test_hf_isolation import running, seq
from tests.rollout.engines.test_partial_rollouts import steps_later, switch_weights

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)


@pytest.fixture()
async def engines(tiny_model_dir):
    """(an engine with the prefix cache, one without it) on the same weights."""
    hot, cold = make_engine(tiny_model_dir), make_engine(tiny_model_dir, prefix_cache_tokens=0)
    await hot.start()
    await cold.start()
    yield hot, cold
    await hot.stop()
    await cold.stop()


def prompt(start: int, n: int) -> tuple[int, ...]:
    return tuple(5 + (start + i) % 250 for i in range(n))


def teacher_forced(model, prompt_ids, output) -> torch.Tensor:
    ids = torch.tensor([list(prompt_ids) + list(output)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)
    positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(output) - 1)
    return logp[0, positions, torch.tensor(output)]


def same(a, b) -> None:
    assert a.output_ids == b.output_ids
    torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


async def test_a_turn_extending_the_last_prefills_only_its_new_tokens_and_equals_a_cold_run(engines):
    hot, cold = engines
    stats = hot.prefix_cache.stats
    for params in (GREEDY, SEEDED):
        first = prompt(0, 40) if params is GREEDY else prompt(100, 33)
        turn1 = await hot.generate(seq("t1", params, prompt=first))
        same(turn1, await cold.generate(seq("t1", params, prompt=first)))
        second = first + tuple(turn1.output_ids) + prompt(60, 9)  # the environment's reply and the next header
        hits, saved = stats.hits, stats.hit_tokens
        turn2 = await hot.generate(seq("t2", params, prompt=second))
        assert stats.hits == hits + 1
        assert stats.hit_tokens - saved == len(first) + len(turn1.output_ids) - 1  # all but the last sample
        same(turn2, await cold.generate(seq("t2", params, prompt=second)))
        if params is GREEDY:
            torch.testing.assert_close(torch.tensor(turn2.logprobs), teacher_forced(hot.model, second, turn2.output_ids),
                                       atol=1e-4, rtol=0)
    assert cold.prefix_cache.stats.lookups == 0 and len(cold.prefix_cache) == 0  # off: not even looked up


async def test_newcomers_with_different_cached_prefix_lengths_prefill_together(engines):
    hot, cold = engines
    firsts = [prompt(0, 20), prompt(30, 45), prompt(90, 70)]
    turn1 = await hot.generate_many([seq(f"a{i}", GREEDY, prompt=p) for i, p in enumerate(firsts)])
    seconds = [p + tuple(o.output_ids) + prompt(200 + 7 * i, 3 + 11 * i) for i, (p, o) in enumerate(zip(firsts, turn1))]
    seconds.append(firsts[1][:30] + prompt(7, 12))  # shares 30 ids with an entry, then goes its own way
    seconds.append(prompt(160, 9))  # shares nothing
    passes, hits = [], hot.prefix_cache.stats.hits
    original = hot._decode._prefill

    def counted(batch, rows, out):
        passes.append(len(rows))
        return original(batch, rows, out)

    hot._decode._prefill = counted
    outs = await hot.generate_many([seq(f"b{i}", GREEDY, prompt=p) for i, p in enumerate(seconds)])
    assert passes == [len(seconds)]  # one prefill pass for all of them
    assert hot.prefix_cache.stats.hits == hits + 4
    for i, p in enumerate(seconds):
        same(outs[i], await cold.generate(seq(f"c{i}", GREEDY, prompt=p)))


async def test_a_weight_switch_empties_the_cache_and_the_next_turn_runs_on_the_new_weights(engines):
    hot, _ = engines
    first = prompt(0, 40)
    turn1 = await hot.generate(seq("t1", GREEDY, prompt=first))
    assert len(hot.prefix_cache) == 1
    await hot.pause("wait", timeout=10)
    switch_weights(hot.model, seed=3)
    hot.set_weight_version(1)
    await hot.resume()
    assert len(hot.prefix_cache) == 0
    second = first + tuple(turn1.output_ids) + prompt(60, 9)
    hits = hot.prefix_cache.stats.hits
    turn2 = await hot.generate(seq("t2", GREEDY, prompt=second))
    assert hot.prefix_cache.stats.hits == hits  # the old version's prefix was not reused
    torch.testing.assert_close(torch.tensor(turn2.logprobs), teacher_forced(hot.model, second, turn2.output_ids),
                               atol=1e-4, rtol=0)


async def test_a_sequence_admitted_before_an_invalidation_is_not_kept(engines):
    hot, _ = engines
    gen = asyncio.create_task(hot.generate(seq("long", SamplingParams(max_new_tokens=200, ignore_eos=True),
                                               prompt=prompt(0, 40))))
    await steps_later(hot, 5)
    hot.set_weight_version(1)  # as if its weights changed under it: whatever it computed is not reused
    await gen
    assert len(hot.prefix_cache) == 0 and hot.prefix_cache.tokens == 0


async def test_a_partial_pause_continuation_equals_an_uninterrupted_run(engines):
    """Interrupted at a token boundary and continued (prompt + tokens so far prefilled again): the same greedy
    ids and logprobs as a run that was never interrupted; after a switch the old prefix is never reused (the
    new version's logprobs are tested in test_partial_rollouts.py, with the cache on as by default)."""
    hot, cold = engines
    params = SamplingParams(max_new_tokens=300, temperature=0.0, ignore_eos=True)
    req = seq("long", params, prompt=prompt(0, 30))
    gen = asyncio.create_task(hot.generate(req))
    await steps_later(hot, 60)
    await hot.pause("partial", timeout=10)
    await hot.resume()
    out = await asyncio.wait_for(gen, 60)
    assert out.version_spans is None and len(out.output_ids) == 300
    same(out, await cold.generate(seq("long", params, prompt=prompt(0, 30))))


async def test_an_aborted_sequence_leaves_its_prefix(engines):
    hot, cold = engines
    task = await running(hot, "gone")
    await steps_later(hot, 20)
    await hot.abort("gone")
    finish, produced = await task
    assert finish.type == "abort" and produced >= 20
    assert len(hot.prefix_cache) == 1
    (entry,) = hot.prefix_cache._entries.values()
    assert len(entry.ids) == 3 + produced - 1 and entry.ids[:3] == (5, 6, 7)
    nxt = entry.ids + (1,) + prompt(0, 20)
    hits = hot.prefix_cache.stats.hits
    out = await hot.generate(seq("next", GREEDY, prompt=nxt))
    assert hot.prefix_cache.stats.hits == hits + 1
    same(out, await cold.generate(seq("next", GREEDY, prompt=nxt)))


async def test_memory_stays_within_the_bound(tiny_model_dir):
    eng = make_engine(tiny_model_dir, prefix_cache_tokens=64)
    await eng.start()
    try:
        cache = eng.prefix_cache
        for i in range(6):
            await eng.generate(seq(f"s{i}", GREEDY, prompt=prompt(30 * i, 30)))  # 53 positions each
            assert cache.tokens <= 64 and len(cache) <= 1
        assert cache.stats.inserted == 6 and cache.stats.evicted == 5
        await eng.generate(seq("big", SamplingParams(max_new_tokens=50, ignore_eos=True), prompt=prompt(0, 30)))
        assert cache.tokens <= 64  # 79 positions: never kept
    finally:
        await eng.stop()


async def test_the_cache_is_visible_in_prometheus(engines):
    from prometheus_client import generate_latest

    from services.rollout.metrics import RolloutMetrics

    hot, _ = engines
    cache = hot.prefix_cache
    metrics = RolloutMetrics()
    metrics.bind_prefix_cache(lambda: cache.stats, lambda: (len(cache), cache.tokens))
    first = prompt(0, 40)
    turn1 = await hot.generate(seq("t1", GREEDY, prompt=first))
    await hot.generate(seq("t2", GREEDY, prompt=first + tuple(turn1.output_ids) + (9,)))
    text = generate_latest(metrics.registry).decode()
    assert "fleetrl_rollout_prefix_cache_hits_total 1.0" in text
    assert f"fleetrl_rollout_prefix_cache_hit_tokens_total {len(first) + 23}.0" in text
    assert "fleetrl_rollout_prefix_cache_entries 1.0" in text  # turn 2 extends turn 1: one entry serves both


async def test_a_failing_prefill_on_a_cached_prefix_falls_back_to_the_whole_prompt(engines):
    """If the pass on cached prefixes fails, the newcomers prefill one by one from their whole prompts: none is
    ended for the cache's sake, and what they generate is what they would have."""
    hot, cold = engines
    first = prompt(0, 40)
    turn1 = await hot.generate(seq("t1", GREEDY, prompt=first))
    seconds = [first + tuple(turn1.output_ids) + prompt(60, 9), prompt(100, 30)]
    model, real_forward, failed = hot.model, hot.model.forward, []

    def forward(*args, **kwargs):
        past = kwargs.get("past_key_values")
        if kwargs["input_ids"].shape[1] > 1 and past is not None and past.get_seq_length() > 0:
            failed.append(1)
            raise RuntimeError("injected failure on a cached prefix")
        return real_forward(*args, **kwargs)

    model.forward = forward
    try:
        outs = await hot.generate_many([seq(f"b{i}", GREEDY, prompt=p) for i, p in enumerate(seconds)])
    finally:
        del model.forward
    assert failed
    for i, p in enumerate(seconds):
        assert outs[i].finish.type == "length"
        same(outs[i], await cold.generate(seq(f"c{i}", GREEDY, prompt=p)))
