"""Structured outputs for the hf engine: a request's regex / JSON schema / EBNF grammar constrains every token it
samples, through llguidance (the grammar library vLLM and SGLang also offer; pure Rust, no GPU, no extra deps).

A grammar is compiled when its sequence is submitted, in a worker thread (never on the event loop, never on the
decode thread), bounded three ways: its text at most ``engine.max_grammar_chars``, its compile time at most
``engine.grammar_compile_timeout_s`` (else 400), and llguidance's own parser limits (grammar size, lexer states, and
fuel per token: ``LLParserLimits``' defaults), which also bound the work of each token's mask on the decode thread.
A grammar llguidance refuses is a 400 naming what is wrong. Compiled grammars are cached (the ``n`` samples of a
request share one compile); each sequence gets its own matcher.

Per token, the row's matcher gives the allowed tokens (the logits of the others become -inf before sampling, so the
logprobs are those of the constrained distribution), then consumes the sampled token; when the grammar is complete
and allows nothing more, the sequence ends (``finish_reason`` stop).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import torch

from services.rollout.engines.base import SequenceRejected
from services.rollout.engines.types import Grammar

if TYPE_CHECKING:
    # a TypedDict of its stubs (llguidance itself stays a lazy import)
    from llguidance._lib import JsonCompileOptions

_CACHED = 64
"""Compiled grammar texts kept (least recently used dropped)."""


JSON_DEFAULTS: JsonCompileOptions = {"whitespace_flexible": False}
"""JSON is written compact (``", "`` and ``": "`` between items, as ``json.dumps`` writes it), not with any
whitespace JSON allows: with flexible whitespace a model can spend its whole ``max_tokens`` on blanks between two
keys (a known failure of JSON modes; vLLM's ``disable_any_whitespace`` is the same switch), leaving an unfinished
object. A schema's own ``x-guidance`` options (llguidance's) win over these."""


def grammar_text(g: Grammar) -> str:
    """The llguidance grammar of a request's constraint (ValueError naming what is wrong)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if g.kind == "regex":
        return LLMatcher.grammar_from_regex(g.spec)
    if g.kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
    if g.kind == "json_schema":
        try:
            schema = json.loads(g.spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema is not JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("json_schema must be a JSON object (a schema)")
        if isinstance(schema, bool):
            return LLMatcher.grammar_from_json_schema(json.dumps(schema))
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS)
    if g.kind == "ebnf":
        try:
            lark = any_to_lark(g.spec)  # GBNF (SGLang's / xgrammar's EBNF) or Lark, as llguidance reads them
        except Exception as exc:  # noqa: BLE001 - the converter raises bare Exceptions for grammar mistakes
            raise ValueError(f"not a grammar llguidance reads: {exc}") from None
        return LLMatcher.grammar_from_lark(lark)
    raise ValueError(f"unknown grammar kind {g.kind!r}")


class RowGrammar:
    """One sequence's matcher: which tokens may come next, and the tokens sampled so far."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self._m = matcher
        self._vocab = vocab

    def allowed(self, device: torch.device) -> torch.Tensor:
        """[vocab] bool: the tokens the grammar allows next (ids past the tokenizer's vocabulary never are)."""
        bias = self._m.compute_logit_bias()
        if self._m.is_error():
            raise ValueError(f"structured output: {self._m.get_error()}")
        allowed = torch.zeros(self._vocab, dtype=torch.bool)
        mask = torch.frombuffer(bytearray(bias), dtype=torch.uint8).bool()[: self._vocab]
        allowed[: mask.numel()] = mask
        return allowed.to(device)

    def consume(self, token: int) -> None:
        if not self._m.consume_token(token):
            raise ValueError(f"structured output: token {token} is not allowed here ({self._m.get_error()})")

    @property
    def complete(self) -> bool:
        """The grammar is satisfied and allows no further token."""
        return bool(self._m.is_stopped())


class Grammars:
    """The engine's grammar compiler: llguidance's view of the tokenizer (built once, on first use) and a cache
    of compiled grammar texts."""

    def __init__(self, tokenizer: Any, vocab: int, eos_ids: frozenset[int], max_chars: int, timeout_s: float) -> None:
        self._tokenizer = tokenizer
        self._vocab = vocab
        self._eos = sorted(eos_ids)
        self.max_chars = max_chars
        self.timeout_s = timeout_s
        self._lltok: Any = None
        self._lock = threading.Lock()
        self._texts: OrderedDict[Grammar, str] = OrderedDict()

    async def matcher(self, g: Grammar, resumed: tuple[int, ...] = ()) -> RowGrammar:
        """A fresh matcher for one sequence, past its ``resumed`` tokens (a partial-rollout continuation's own
        earlier output); SequenceRejected, a 400, for a grammar that is too large, too slow to compile or invalid."""
        if len(g.spec) > self.max_chars:
            raise SequenceRejected(f"the {g.kind} has {len(g.spec)} characters; this engine takes at most "
                                   f"{self.max_chars} (engine.max_grammar_chars)")
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._build, g, resumed), self.timeout_s)
        except TimeoutError:
            raise SequenceRejected(f"compiling the {g.kind} took over {self.timeout_s} s "
                                   "(engine.grammar_compile_timeout_s)") from None
        except (ValueError, TypeError, RuntimeError) as exc:
            raise SequenceRejected(f"{g.kind}: {exc}") from None

    def _build(self, g: Grammar, resumed: tuple[int, ...] = ()) -> RowGrammar:
        from llguidance import LLMatcher

        with self._lock:
            if self._lltok is None:
                import llguidance.hf

                self._lltok = llguidance.hf.from_tokenizer(self._tokenizer, n_vocab=self._vocab,
                                                           eos_token=self._eos or None)
            text = self._texts.get(g)
            if text is not None:
                self._texts.move_to_end(g)
        if text is None:
            text = grammar_text(g)
            error = LLMatcher.validate_grammar(text, self._lltok)
            if error:
                raise ValueError(error)
            with self._lock:
                self._texts[g] = text
                while len(self._texts) > _CACHED:
                    self._texts.popitem(last=False)
        matcher = LLMatcher(self._lltok, text, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        row = RowGrammar(matcher, self._vocab)
        for token in resumed:
            row.consume(token)
        return row
