"""Continuous batching in the hf engine: a sequence that arrives while a batch decodes joins it at a step boundary
and leaves when it is done (it does not wait for the batch, nor the batch for it), and what every sequence
generates is what it generates alone. The batch's KV buffers are written in place: a decode step, a newcomer
joining and a row leaving copy no running row's cache."""

from __future__ import annotations

import asyncio

import torch

from services.rollout.engines.hf.batch import COLUMNS_STEP, RETAINED_POSITIONS, KVBatch
from services.rollout.engines.hf.loop import _fill_holes
from services.rollout.engines.types import SamplingParams
from tests.rollout.engines.conftest import make_engine
from tests.rollout.engines.test_batch import alone
from tests.rollout.engines.test_hf_isolation import seq

CPU = torch.device("cpu")


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def prompt(start: int, n: int) -> tuple[int, ...]:
    return tuple(5 + (start + i) % 250 for i in range(n))


async def test_a_sequence_arriving_mid_decode_finishes_first_with_the_tokens_it_has_alone(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    await engine.start()
    try:
        longs = [asyncio.create_task(engine.generate(seq(f"long{i}", greedy(200), prompt=prompt(10 * i, 30 + i))))
                 for i in range(3)]
        loop = engine._decode
        while loop.running < 3 or loop.steps < 20:  # the long batch is decoding
            await asyncio.sleep(0.01)
        joined_at = loop.steps
        short = await engine.generate(seq("short", greedy(8), prompt=prompt(100, 50)))
        assert not any(t.done() for t in longs)  # it joined the running batch and left it before the batch ended
        assert loop.steps - joined_at < 60  # ... after about its own 8 steps, not the long rows' 200
        outs = await asyncio.gather(*longs)
        alone = await engine.generate(seq("short-alone", greedy(8), prompt=prompt(100, 50)))
        assert short.output_ids == alone.output_ids and len(short.output_ids) == 8
        torch.testing.assert_close(torch.tensor(short.logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=0)
        for i, out in enumerate(outs):  # the long rows were not disturbed by the row joining and leaving
            solo = await engine.generate(seq(f"long{i}-alone", greedy(200), prompt=prompt(10 * i, 30 + i)))
            assert out.output_ids == solo.output_ids
    finally:
        await engine.stop()


def test_rows_of_any_length_join_and_leave_in_any_order_and_the_buffers_grow_and_shrink(model):
    """Rows of very different lengths (past the first column capacity), joining a running batch, leaving in an
    order that moves rows around: every row's logits equal its sequence run alone, step after step."""
    seqs = {"a": list(prompt(0, 5)), "b": list(prompt(50, COLUMNS_STEP + 40)), "c": list(prompt(90, 17))}
    order = ["a", "b"]
    batch = KVBatch(model)
    with torch.inference_mode():
        batch.prefill([seqs["a"], seqs["b"]], 0, CPU)
        assert batch.column_capacity >= len(seqs["b"]) and batch.column_capacity % COLUMNS_STEP == 0

        def step(tokens):
            logits = batch.step(torch.tensor(tokens))
            for name, t, row in zip(order, tokens, logits):
                seqs[name].append(t)
                torch.testing.assert_close(row, alone(model, seqs[name]), atol=1e-5, rtol=0)

        step([7, 8])
        first = batch.prefill([seqs["c"], list(prompt(200, 3))], 0, CPU)
        seqs["d"] = list(prompt(200, 3))
        order += ["c", "d"]
        torch.testing.assert_close(first[0], alone(model, seqs["c"]), atol=1e-5, rtol=0)
        step([9, 10, 11, 12])
        batch.keep([3, 2, 0])  # b leaves; d, c and a in a new order
        order = ["d", "c", "a"]
        assert batch.lengths == [len(seqs[n]) for n in order]
        step([13, 14, 15])
        batch.keep([1])  # only c (short) is left: the columns shrink to what it needs
        order = ["c"]
        assert batch.column_capacity == COLUMNS_STEP
        step([16])
        step([17])
        batch.keep([])  # empty: small buffers stay for the next batch, freed on drop()
        assert batch.size == 0 and batch.keys and batch.row_capacity * batch.column_capacity <= RETAINED_POSITIONS
        batch.drop()
        assert batch.keys == [] and batch.row_capacity == batch.column_capacity == 0


def test_steps_and_joins_write_the_cache_in_place(model):
    batch = KVBatch(model)
    with torch.inference_mode():
        batch.prefill([list(prompt(0, 10)), list(prompt(20, 12))], 0, CPU)
        batch.keep([0, 1])
        batch.prefill([list(prompt(40, 9))], 0, CPU)  # room for 3 rows: reserved by the growth to 2 -> 4 rows
        keys = batch.keys[0]
        before = keys[0, :, :10].clone()
        for t in range(5):
            batch.step(torch.tensor([t, t, t]))
        batch.prefill([list(prompt(60, 4))], 0, CPU)
        assert batch.keys[0] is keys  # no new buffer: steps and the newcomer wrote into it
        torch.testing.assert_close(keys[0, :, :10], before)  # a running row's cached positions are untouched


def test_rows_that_leave_are_replaced_by_rows_from_the_end():
    assert _fill_holes([0, 1, 2]) == [0, 1, 2]
    assert _fill_holes([0, 2, 3, 5, 6]) == [0, 6, 2, 3, 5]  # only row 6 moves (into the slot row 1 left)
    assert _fill_holes([1, 2, 3]) == [3, 1, 2]
    assert _fill_holes([4]) == [4]


def test_rows_of_one_length_step_without_a_mask_and_match_alone(model, monkeypatch):
    """Rows all as long (a group of samples of one prompt) attend over every column: the step passes no mask
    (sdpa's fast path) and gives each row's logits alone; once lengths differ, a mask keeps rows apart."""
    seqs = [list(prompt(0, 20)), list(prompt(0, 20)), list(prompt(30, 20))]
    masks = []
    real = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **k: masks.append(k.get("attention_mask")) or real(*a, **k))
    batch = KVBatch(model)
    with torch.inference_mode():
        batch.prefill([list(s) for s in seqs], 0, CPU)
        for t in (7, 8):
            logits = batch.step(torch.tensor([t, t + 1, t + 2]))
            for i, s in enumerate(seqs):
                s.append(t + i)
                torch.testing.assert_close(logits[i], alone(model, s), atol=1e-5, rtol=0)
        assert masks[1] is None and masks[2] is None
        batch.prefill([list(prompt(60, 5))], 0, CPU)
        batch.step(torch.tensor([1, 2, 3, 4]))
        assert masks[-1] is not None
