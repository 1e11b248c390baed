"""Structured outputs in the hf engine (llguidance): sampled text always parses under the request's regex, JSON
schema or EBNF grammar; bad or oversized grammars are refused for their request alone."""

from __future__ import annotations

import json
import time

import pytest
import regex

from services.rollout.engines.base import SequenceRejected
from services.rollout.engines.types import Grammar, SamplingParams, SequenceRequest
from tests.rollout.engines.conftest import make_engine

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "age", "ok"], "additionalProperties": False}


def _seq(rid: str, grammar: Grammar, seed: int, prompt=(5, 6, 7, 8), max_new_tokens=160) -> SequenceRequest:
    return SequenceRequest(rid=rid, prompt_ids=tuple(prompt), params=SamplingParams(
        max_new_tokens=max_new_tokens, temperature=1.0, seed=seed, grammar=grammar))


def _valid(instance: dict) -> bool:
    return (set(instance) == {"name", "age", "ok"} and isinstance(instance["name"], str) and len(instance["name"]) <= 8
            and type(instance["age"]) is int and 0 <= instance["age"] <= 120 and type(instance["ok"]) is bool)


async def test_one_hundred_sampled_json_answers_all_parse_under_the_schema(engine):
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    started = time.perf_counter()
    outs = await engine.generate_many([_seq(f"j{i}", grammar, seed=i, prompt=(5 + i % 50, 6, 7)) for i in range(100)])
    elapsed = time.perf_counter() - started
    texts = [o.text for o in outs]
    assert all(o.finish.type == "stop" for o in outs), [(o.finish, o.text) for o in outs if o.finish.type != "stop"]
    parsed = [json.loads(t) for t in texts]
    assert all(_valid(p) for p in parsed), [p for p in parsed if not _valid(p)]
    assert len(set(texts)) > 50  # sampled, not one forced answer
    print(f"100 json answers, {sum(len(o.output_ids) for o in outs)} tokens in {elapsed:.1f} s")


async def test_json_answers_are_compact_and_finish_well_inside_max_tokens(engine):
    """No runs of blanks between keys: with JSON's flexible whitespace a random model wrote 100+ tokens of \\r\\t\\n
    between two keys and hit max_tokens with the object unfinished (a clean clone's run of the HTTP test)."""
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    outs = await engine.generate_many([_seq(f"w{i}", grammar, seed=100 + i, max_new_tokens=60) for i in range(24)])
    assert all(o.finish.type == "stop" for o in outs), [(o.finish, o.text) for o in outs if o.finish.type != "stop"]
    assert not any(c in o.text for o in outs for c in "\n\r\t"), [o.text for o in outs]
    assert all(_valid(json.loads(o.text)) for o in outs)


async def test_regex_and_ebnf_and_json_object(engine):
    cases = [
        (Grammar("regex", r"(yes|no) [0-9]{1,3}"), lambda t: regex.fullmatch(r"(yes|no) [0-9]{1,3}", t)),
        (Grammar("ebnf", 'root ::= "answer: " ("red" | "green" | "blue")'),
         lambda t: t in ("answer: red", "answer: green", "answer: blue")),
    ]
    for k, (grammar, ok) in enumerate(cases):
        outs = await engine.generate_many([_seq(f"g{k}-{i}", grammar, seed=i) for i in range(10)])
        assert all(o.finish.type == "stop" and ok(o.text) for o in outs), (grammar.kind, [o.text for o in outs])
    # any JSON object: the untrained model writes free-form keys that may outrun max_new_tokens; those that end
    # have ended because the object is whole
    outs = await engine.generate_many([_seq(f"o{i}", Grammar("json_object", ""), seed=i) for i in range(10)])
    whole = [o for o in outs if o.finish.type == "stop"]
    assert whole and all(isinstance(json.loads(o.text), dict) for o in whole)


@pytest.mark.parametrize("grammar, says", [
    (Grammar("regex", "(unclosed"), "regex"),
    (Grammar("json_schema", "{not json"), "json_schema is not JSON"),
    (Grammar("json_schema", '{"type": 5}'), "json_schema"),
    (Grammar("ebnf", "root ::= missing_rule"), "ebnf"),
    (Grammar("regex", "a" * 70_000), "engine.max_grammar_chars"),
])
async def test_a_bad_grammar_is_refused_for_its_request_alone(engine, grammar, says):
    with pytest.raises(SequenceRejected, match=regex.escape(says)):
        await engine.generate(_seq("bad", grammar, seed=1))
    ok = await engine.generate(SequenceRequest(rid="ok", prompt_ids=(5, 6), params=SamplingParams(max_new_tokens=2, ignore_eos=True)))
    assert len(ok.output_ids) == 2  # the engine still serves a plain request after the refusal


async def test_compile_time_is_bounded(tiny_model_dir):
    eng = make_engine(tiny_model_dir, grammar_compile_timeout_s=0.001)
    await eng.start()
    try:
        big = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{{i},{i + 40}}}$"}
                                                for i in range(200)}}
        with pytest.raises(SequenceRejected, match="took over 0.001 s"):
            await eng.generate(_seq("slow", Grammar("json_schema", json.dumps(big)), seed=1))
    finally:
        await eng.stop()
