"""The hf engine honours SGLang's / vLLM's sampling features beyond the core: penalties (by hand), min_new_tokens,
stop_regex (bounded), spaces_between_special_tokens; an engine refuses what it does not list in ``honours``."""

from __future__ import annotations

import pytest
import torch

from services.rollout.engines.hf.sampling import Penalties, penalised
from services.rollout.engines.hf.text import IncrementalText, StopRegex
from services.rollout.engines.types import FEATURES, Grammar, SamplingParams, SequenceRequest


def test_penalties_by_hand():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    p = Penalties.of(0.5, 0.25, 2.0, prompt_ids=[1], vocab=4, device=torch.device("cpu"))
    for t in (0, 0, 2):
        p.add(t)
    # token 0: out twice -> 2 / 2 - 0.5 * 2 - 0.25 = -0.25; token 1: in the prompt -> -1 * 2 = -2;
    # token 2: out once -> 0.5 / 2 - 0.5 - 0.25 = -0.5; token 3: never seen -> 3
    assert penalised(logits, p).tolist() == pytest.approx([-0.25, -2.0, -0.5, 3.0])
    assert Penalties.of(0.0, 0.0, 1.0, [1], 4, torch.device("cpu")) is None
    with pytest.raises(ValueError, match="repetition_penalty"):
        Penalties.of(0.0, 0.0, 0.0, [1], 4, torch.device("cpu"))


def test_features_used_names_what_is_not_at_its_default():
    assert SamplingParams().features_used() == []
    p = SamplingParams(min_new_tokens=2, stop_regex=("a",), grammar=Grammar("regex", "a+"))
    assert p.features_used() == ["min_new_tokens", "stop_regex", "grammar"]
    assert set(FEATURES) == {"min_new_tokens", "stop_regex", "spaces_between_special_tokens", "frequency_penalty",
                             "presence_penalty", "repetition_penalty", "grammar"}


def test_stop_regex_ends_the_text_at_the_earliest_match_and_names_the_pattern():
    from deploy.local.tiny_model import build_tokenizer

    tok = build_tokenizer()
    text = IncrementalText(tok, True, (), False, StopRegex.of([r"\d+!", "zz"], 64, 0.5))
    matched = None
    for t in tok.encode("abc 12! more"):
        matched = matched or text.push(t)
    assert matched == r"\d+!" and text.text == "abc "
    kept = IncrementalText(tok, True, (), True, StopRegex.of([r"\d+!"], 64, 0.5))
    for t in tok.encode("abc 12! more"):
        if kept.push(t):
            break
    assert kept.text == "abc 12!"


def test_a_stop_regex_search_that_runs_too_long_ends_the_sequence_naming_it():
    slow = StopRegex.of([r"(a+)+$b"], 10_000, 0.001)
    with pytest.raises(ValueError, match=r"could not be searched within 0.001 s"):
        slow.find("a" * 5000 + "c", 0)


def test_nothing_stops_a_text_that_is_not_armed():
    from deploy.local.tiny_model import build_tokenizer

    tok = build_tokenizer()
    text = IncrementalText(tok, True, ("b",), False)
    text.armed = False
    assert all(text.push(t) is None for t in tok.encode("ab"))
    text.armed = True
    assert text.push(tok.encode("c")[0]) is None  # the old "b" is behind it: not searched again (as SGLang)


def _seq(rid: str, params: SamplingParams, prompt=(5, 6, 7, 8)) -> SequenceRequest:
    return SequenceRequest(rid=rid, prompt_ids=tuple(prompt), params=params)


async def test_min_new_tokens_holds_off_every_stop(engine):
    free = await engine.generate(_seq("free", SamplingParams(max_new_tokens=8, temperature=0.0)))
    first = free.output_ids[0]
    stopped = await engine.generate(_seq("stop", SamplingParams(max_new_tokens=8, temperature=0.0,
                                                                stop_token_ids=(first,))))
    assert stopped.output_ids == [first] and stopped.finish.type == "stop"
    held = await engine.generate(_seq("held", SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(first,),
                                                             min_new_tokens=5)))
    assert len(held.output_ids) >= 5 and first not in held.output_ids[:4]


async def test_repetition_penalty_changes_a_greedy_answer_that_repeats(engine):
    plain = await engine.generate(_seq("plain", SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)))
    assert len(set(plain.output_ids)) < len(plain.output_ids), "the tiny model's greedy text repeats a token"
    pen = await engine.generate(_seq("pen", SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True,
                                                           presence_penalty=2.0, repetition_penalty=2.0)))
    assert pen.output_ids != plain.output_ids
    assert len(set(pen.output_ids)) > len(set(plain.output_ids))


async def test_the_engine_lists_what_it_honours(engine):
    assert {"min_new_tokens", "stop_regex", "frequency_penalty", "presence_penalty",
            "repetition_penalty", "spaces_between_special_tokens"} <= engine.honours
