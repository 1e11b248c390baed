"""Partial rollouts on the hf engine in-process: a generation interrupted by weight switches continues from its
exact tokens under each new version, and says which version produced which tokens (issue 14)."""

from __future__ import annotations

import asyncio

import torch

from services.rollout.engines.types import SamplingParams
from tests.rollout.engines.test_hf_isolation import seq

NEW = 400


async def steps_later(engine, n: int) -> None:
    start = engine._decode.steps
    for _ in range(2000):
        if engine._decode.steps >= start + n:
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the decode loop made no progress")


def switch_weights(model, seed: int) -> dict[str, torch.Tensor]:
    """Perturb every weight in place (as the sidecar copies a new version in) and return a copy of the result."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def teacher_forced_logprobs(model_dir, weights, prompt, output) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(weights)
    ids = torch.tensor([list(prompt) + list(output)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return logp[0, positions, torch.tensor(output)]


async def test_a_generation_spanning_two_weight_switches_continues_from_its_tokens_under_each_version(
        engine, tiny_model_dir):
    weights = {0: {k: v.detach().clone() for k, v in engine.model.state_dict().items()}}
    req = seq("long", SamplingParams(max_new_tokens=NEW, ignore_eos=True, temperature=1.0))
    gen = asyncio.create_task(engine.generate(req))
    for version in (1, 2):
        await steps_later(engine, 60)
        await engine.pause("partial", timeout=10)
        assert engine.inflight == 0  # interrupted at a token boundary, nothing runs during the switch
        weights[version] = switch_weights(engine.model, seed=version)
        engine.set_weight_version(version)
        await engine.resume()
    out = await asyncio.wait_for(gen, 60)

    assert out.finish.type == "length" and len(out.output_ids) == len(out.logprobs) == NEW
    spans = out.version_spans
    assert [v for _, v in spans] == [0, 1, 2] and spans[0][0] == 0 and 0 < spans[1][0] < spans[2][0] < NEW, spans
    assert out.weight_version == 0  # the oldest token's version
    # every token's logprob is the one its own version gives it, in the context of all the tokens before it
    ends = [s for s, _ in spans[1:]] + [NEW]
    engine_lp = torch.tensor(out.logprobs)
    for (start, version), end in zip(spans, ends):
        mine = teacher_forced_logprobs(tiny_model_dir, weights[version], req.prompt_ids, out.output_ids)
        torch.testing.assert_close(engine_lp[start:end], mine[start:end], atol=2e-3, rtol=0)
    # and the check can tell versions apart: the second span's tokens under the first version's weights differ
    other = teacher_forced_logprobs(tiny_model_dir, weights[0], req.prompt_ids, out.output_ids)
    start, end = spans[1][0], ends[1]
    assert (engine_lp[start:end] - other[start:end]).abs().max() > 0.05


async def test_abort_mode_still_ends_sequences_and_wait_mode_lets_them_finish_on_one_version(engine):
    gen = asyncio.create_task(engine.generate(seq("a", SamplingParams(max_new_tokens=NEW, ignore_eos=True))))
    await steps_later(engine, 20)
    await engine.pause("abort", timeout=10)
    await engine.resume()
    out = await asyncio.wait_for(gen, 30)
    assert out.finish.type == "abort" and 0 < len(out.output_ids) < NEW and out.version_spans is None

    gen = asyncio.create_task(engine.generate(seq("w", SamplingParams(max_new_tokens=50, ignore_eos=True))))
    await steps_later(engine, 5)
    await engine.pause("wait", timeout=30)
    engine.set_weight_version(7)
    await engine.resume()
    out = await asyncio.wait_for(gen, 30)
    assert out.finish.type == "length" and out.weight_version == 0 and out.version_spans is None


async def test_a_streamed_generation_interrupted_by_a_switch_streams_on_with_each_deltas_version(engine):
    deltas = []

    async def consume():
        async for d in engine.stream(seq("s", SamplingParams(max_new_tokens=120, ignore_eos=True), stream=True)):
            deltas.append(d)

    task = asyncio.create_task(consume())
    await steps_later(engine, 30)
    await engine.pause("partial", timeout=10)
    switch_weights(engine.model, seed=3)
    engine.set_weight_version(1)
    await engine.resume()
    await asyncio.wait_for(task, 30)
    assert sum(len(d.token_ids) for d in deltas) == 120
    assert [d.finish.type for d in deltas if d.finish is not None] == ["length"]  # one finish, at the end
    versions = [d.weight_version for d in deltas if d.token_ids]
    assert versions == sorted(versions) and set(versions) == {0, 1}


async def test_a_structured_output_interrupted_by_a_switch_carries_its_grammar_on(engine):
    """The continuation's matcher is past the tokens already produced: the answer still parses as a whole."""
    import json

    from services.rollout.engines.types import Grammar

    schema = {"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                                         "minItems": 6, "maxItems": 8}},
              "required": ["words"], "additionalProperties": False}
    req = seq("json", SamplingParams(max_new_tokens=NEW, temperature=1.0, seed=3,
                                     grammar=Grammar("json_schema", json.dumps(schema))))
    gen = asyncio.create_task(engine.generate(req))
    await steps_later(engine, 12)
    await engine.pause("partial", timeout=10)
    engine.set_weight_version(1)
    await engine.resume()
    out = await asyncio.wait_for(gen, 120)
    assert out.version_spans is not None and len(out.version_spans) == 2, "the switch came mid-answer"
    assert out.finish.type == "stop"
    words = json.loads(out.text)["words"]
    assert 6 <= len(words) <= 8
