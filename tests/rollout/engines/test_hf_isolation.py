"""The hf engine in-process: one sequence's failure is its own, and liveness never waits behind the backlog.

Issue 17 #4 (a request whose ``top_k`` overflowed aborted every sequence in the batch) and #7 (``/health``
queued a probe behind up to 1,024 sequences, so a busy replica looked dead).
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import aclosing

import pytest
import torch

from services.rollout.engines.hf import loop as loop_module
from services.rollout.engines.hf.engine import HFEngine
from services.rollout.engines.types import SamplingParams, SequenceRequest
from tests.rollout.engines.conftest import make_engine

LONG = SamplingParams(max_new_tokens=300, ignore_eos=True)




def seq(rid: str, params: SamplingParams = LONG, prompt=(5, 6, 7), stream: bool = False) -> SequenceRequest:
    return SequenceRequest(rid=rid, prompt_ids=tuple(prompt), params=params, stream=stream)


async def running(engine: HFEngine, rid: str):
    """Start a streamed sequence and return (its delta iterator, a task collecting it) once it decodes."""
    deltas = engine.stream(seq(rid, stream=True))
    first = await deltas.__anext__()

    async def rest():
        finish, tokens = first.finish, len(first.token_ids)
        async with aclosing(deltas):
            async for d in deltas:
                tokens += len(d.token_ids)
                finish = d.finish or finish
        return finish, tokens

    return asyncio.create_task(rest())


BAD_PARAMS = [
    (SamplingParams(temperature=float("nan")), "temperature"),
    (SamplingParams(temperature=float("inf")), "temperature"),
    (SamplingParams(temperature=-1.0), "temperature"),
    (SamplingParams(top_p=float("nan")), "top_p"),
    (SamplingParams(top_p=0.0), "top_p"),
    (SamplingParams(min_p=2.0), "min_p"),
    (SamplingParams(seed=2**70), "seed"),
    (SamplingParams(seed=-(2**64)), "seed"),
    (SamplingParams(max_new_tokens=0), "max_new_tokens"),
    (SamplingParams(top_logprobs=-1), "top_logprobs"),
]


async def test_bad_parameters_fail_their_request_alone(engine):
    """What the wire layer refuses is refused again at submit time (the worker and extensions reach the engine
    directly); what the engine can hold (a huge ``top_k``, the largest seed) runs beside the others."""
    good = await running(engine, "good")
    for params, name in BAD_PARAMS:
        with pytest.raises(ValueError, match=name):
            await engine.generate(seq(f"bad-{name}", params))
    with pytest.raises(ValueError, match="vocabulary"):  # past the embedding table: refused, not an IndexError mid-batch
        await engine.generate(seq("bad-ids", SamplingParams(), prompt=(5, 10**6)))
    edge = await engine.generate(seq("edge", SamplingParams(max_new_tokens=3, top_k=2**70, seed=2**64 - 1,
                                                            temperature=1e-30, top_logprobs=10**6)))
    assert edge.finish.type == "length" and len(edge.output_ids) == 3
    assert len(edge.top_logprobs[0]) == engine._decode.vocab_size  # clamped to the vocabulary
    finish, tokens = await good
    assert finish.type == "length" and tokens == 300


async def test_a_sampling_failure_of_one_row_ends_that_row_alone(engine, monkeypatch):
    """A sampling error (here injected for rows at one temperature, as NaN logits would cause) ends only them."""
    poison = 0.375
    real = loop_module.sample

    def sample(logits, rs, shared):
        if bool((rs.temperature == poison).any()):
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(logits, rs, shared)

    monkeypatch.setattr(loop_module, "sample", sample)
    good = await running(engine, "good")
    bad = await engine.generate(seq("bad", SamplingParams(max_new_tokens=5, temperature=poison)))
    assert bad.finish.type == "abort" and "probability tensor" in bad.finish.message
    finish, tokens = await good
    assert finish.type == "length" and tokens == 300


async def test_a_prefill_failure_of_one_prompt_spares_the_batch_and_the_other_newcomers(engine):
    """A forward pass that fails on one prompt (here: an injected failure on token id 77) ends that prompt's
    sequence only: the running batch and the prompts that joined with it go on."""
    model = engine.model
    real_forward = model.forward

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1 and bool((ids == 77).any()):
            raise RuntimeError("injected prefill failure")
        return real_forward(*args, **kwargs)

    model.forward = forward
    try:
        good = await running(engine, "good")
        newcomers = [engine.generate(seq("new-a", SamplingParams(max_new_tokens=4, ignore_eos=True), prompt=(9, 10))),
                     engine.generate(seq("poison", SamplingParams(max_new_tokens=4), prompt=(9, 77, 10))),
                     engine.generate(seq("new-b", SamplingParams(max_new_tokens=4, ignore_eos=True), prompt=(11, 12)))]
        a, poisoned, b = await asyncio.gather(*newcomers)
    finally:
        del model.forward
    assert poisoned.finish.type == "abort" and "injected prefill failure" in poisoned.finish.message
    assert a.finish.type == b.finish.type == "length" and len(a.output_ids) == len(b.output_ids) == 4
    finish, tokens = await good
    assert finish.type == "length" and tokens == 300


async def test_liveness_under_a_deep_backlog_answers_at_once(tiny_model_dir):
    """200 long sequences, 4 decoded at a time: a probe queued at the back would wait for ~50 rounds."""
    engine = make_engine(tiny_model_dir, max_batch_size=4, health_timeout_s=3.0)
    await engine.start()
    try:
        tasks = [asyncio.create_task(engine.generate(seq(f"load-{i}", SamplingParams(max_new_tokens=400, ignore_eos=True))))
                 for i in range(200)]
        await asyncio.sleep(0.5)
        assert engine.queue_depth > 100
        for _ in range(5):
            started = time.monotonic()
            assert await engine.health() is True
            assert time.monotonic() - started < 0.5
            await asyncio.sleep(0.1)
        # readiness runs a real generation through the queue: it cannot finish in time behind this backlog
        started = time.monotonic()
        assert await engine.health_generate() is False
        assert time.monotonic() - started < 3.0 + 1.0
        await engine.pause("abort")
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.resume()
        assert await engine.health() is True and await engine.health_generate() is True  # idle: the real probe
    finally:
        await engine.stop()


async def test_liveness_fails_when_the_loop_has_work_but_makes_no_progress(tiny_model_dir):
    # Margins for a loaded machine (this ran beside other pytest workers): the "not stalled yet" check comes
    # 0.1 s into a 2 s window, and the probe timeout is long, so every False below comes from the stall clock,
    # never from a probe that timed out: a probe would wait on the gate for the whole 30 s.
    stall_s = 2.0
    engine = make_engine(tiny_model_dir, health_stall_s=stall_s, health_timeout_s=30.0)
    await engine.start()
    gate = threading.Event()
    model = engine.model
    real_forward = model.forward

    def forward(*args, **kwargs):
        gate.wait(30)  # a hung device
        return real_forward(*args, **kwargs)

    try:
        assert await engine.health() is True  # idle: the one-token probe runs
        model.forward = forward
        stuck = asyncio.create_task(engine.generate(seq("stuck", SamplingParams(max_new_tokens=2))))
        await asyncio.sleep(0.1)
        assert await engine.health() is True  # stuck for less than health_stall_s
        await asyncio.sleep(stall_s + 0.2)
        started = time.monotonic()
        assert await engine.health() is False
        assert time.monotonic() - started < 5.0  # known without a probe (one would wait out the 30 s timeout)
        gate.set()
        assert (await stuck).finish.type == "length"
        assert await engine.health() is True
    finally:
        gate.set()
        model.__dict__.pop("forward", None)
        await engine.stop()


async def test_idle_liveness_is_a_real_generation(engine):
    model = engine.model

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    model.forward = broken
    try:
        assert await engine.health() is False
    finally:
        del model.forward
    assert await engine.health() is True


def test_submitted_rows_hold_checked_sampling_tensors(tiny_model_dir):
    """The tensors of a batch are built from checked per-row values, so building them cannot overflow."""
    from services.rollout.engines.hf.sampling import RowSampling, row_params

    rows = [row_params(0.7, 2**62, 1.0, 0.0, vocab=300), row_params(1e-9, -1, 0.5, 0.1, vocab=300)]
    rs = RowSampling.of(rows, [None, None], torch.device("cpu"))
    assert rs.top_k.tolist() == [300, 0] and rs.temperature.tolist()[1] == 0.0
