"""CPU cost of structured outputs in the hf engine, per generated token: the grammar's mask (llguidance) and the
consumed token, measured apart from the model on the tiny model's tokenizer (261 tokens), and the compile time.

    python benchmarks/structured_output_cost.py [--tokens 4000]

Prints compile ms and mask + consume us per token for a JSON schema, a regex and an EBNF grammar. What grows with
a real vocabulary (150k tokens) is the mask: llguidance computes it in Rust over a token trie, then one
bytes -> bool tensor of the vocabulary's size is made per row and token (services/rollout/engines/hf/grammar.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import torch

from deploy.local.tiny_model import build_tokenizer
from services.rollout.engines.hf.grammar import Grammars
from services.rollout.engines.types import Grammar

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
GRAMMARS = {
    "json_schema": Grammar("json_schema", json.dumps(SCHEMA)),
    "regex": Grammar("regex", r"(yes|no) [0-9]{1,6}( and (yes|no) [0-9]{1,6}){0,20}"),
    "ebnf": Grammar("ebnf", 'root ::= item (", " item)*\nitem ::= "red" | "green" | "blue"'),
}


async def measure(tokens: int) -> None:
    tok = build_tokenizer()
    vocab = len(tok)
    grammars = Grammars(tok, vocab, frozenset({tok.eos_token_id}), 65536, 30.0)
    await grammars.matcher(GRAMMARS["regex"])  # llguidance's view of the tokenizer, built once per engine
    rng = random.Random(0)
    for name, g in GRAMMARS.items():
        grammars._texts.clear()
        t0 = time.perf_counter()
        row = await grammars.matcher(g)
        compile_ms = (time.perf_counter() - t0) * 1000
        done, spent = 0, 0.0
        while done < tokens:
            t1 = time.perf_counter()
            allowed = row.allowed(torch.device("cpu"))
            ids = allowed.nonzero().flatten().tolist()
            pick = rng.choice(ids)
            row.consume(pick)
            spent += time.perf_counter() - t1
            done += 1
            if row.complete or pick == tok.eos_token_id:
                row = await grammars.matcher(g)  # a new sequence (cached grammar: a fresh matcher only)
        print(f"{name:12s} compile {compile_ms:7.1f} ms   mask + consume {spent / done * 1e6:7.1f} us/token "
              f"({done} tokens, vocab {vocab})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4000)
    asyncio.run(measure(ap.parse_args().tokens))


if __name__ == "__main__":
    main()
