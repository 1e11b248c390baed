"""vLLM's token-in / token-out ``POST /inference/v1/generate`` <-> engine sequences.

The prompt is taken as the ids given (never re-tokenised); the reply carries the sampled ids and, when
``sampling_params.logprobs`` is set, one logprob entry per sampled token spelled ``token_id:<id>`` with the
sampled token first in ``top_logprobs`` (vLLM's order: the sampled token, then the most likely ones, as many
as asked, at least one).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from services.rollout.engines.types import Grammar, SamplingParams, SequenceOutput, SequenceRequest
from services.rollout.protocols.openai import check_model
from services.rollout.service import RolloutService, new_request_id
from shared.generate_api import ChoiceLogprobs, TokenLogprob, TopLogprob
from shared.inference_api import TokenGenerateChoice, TokenGenerateRequest, TokenGenerateResponse, TokenUsage

log = logging.getLogger(__name__)
_warned: set[str] = set()


@dataclass
class TokensPlan:
    request: TokenGenerateRequest
    seqs: list[SequenceRequest]
    prompt: list[int]
    id: str
    top_n: int | None  # None: no logprobs asked


def ignored_fields(r: TokenGenerateRequest) -> list[str]:
    """Unknown fields of the request (vLLM ignores them too); each name is logged once per process."""
    names = [*(r.model_extra or {}), *(f"sampling_params.{k}" for k in r.sampling_params.model_extra or {})]
    if r.stream_options is not None:
        names += [f"stream_options.{k}" for k in r.stream_options.model_extra or {}]
    new = [n for n in names if n not in _warned]
    if new:
        _warned.update(new)
        log.warning("/inference/v1/generate: ignoring fields this server does not know (as vLLM does): %s", new)
    return names


def sampling(service: RolloutService, r: TokenGenerateRequest) -> SamplingParams:
    sp = r.sampling_params
    budget = service.check_prompt(r.token_ids, sp.max_tokens, "token_ids")
    grammar = sp.grammar()
    return SamplingParams(
        max_new_tokens=budget, temperature=sp.temperature,
        top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p, stop=sp.stop_list(), stop_token_ids=tuple(sp.stop_token_ids or ()),
        ignore_eos=sp.ignore_eos, skip_special_tokens=sp.skip_special_tokens,
        no_stop_trim=sp.include_stop_str_in_output, seed=sp.seed,
        top_logprobs=sp.logprobs if sp.logprobs is not None and sp.logprobs > 1 else 0,  # the sampled token comes first anyway
        min_new_tokens=min(sp.min_tokens, budget), spaces_between_special_tokens=sp.spaces_between_special_tokens,
        frequency_penalty=sp.frequency_penalty, presence_penalty=sp.presence_penalty,
        repetition_penalty=sp.repetition_penalty, grammar=Grammar(*grammar) if grammar else None,
    )


def plan(service: RolloutService, r: TokenGenerateRequest) -> TokensPlan:
    check_model(service, r.model)
    ignored_fields(r)
    service.check_stop_ids(r.sampling_params.stop_token_ids)
    service.check_stops(r.sampling_params.stop_list())
    params = sampling(service, r)
    rid = new_request_id()
    seqs = service.sequences([list(r.token_ids)], [params], r.sampling_params.n, bool(r.stream), rid)
    request_id = f"generate-tokens-{r.request_id or rid}"
    return TokensPlan(r, seqs, list(r.token_ids), request_id, r.sampling_params.logprobs)


def logprobs(ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]] | None, top_n: int) -> ChoiceLogprobs:
    """vLLM's entries: ``top_logprobs`` = the sampled token, then the engine's alternatives other than it, at most
    ``max(top_n, 1)`` in all."""
    content = []
    for k, (tid, lp) in enumerate(zip(ids, lps)):
        lp = max(lp, -9999.0)  # vLLM clamps -inf to -9999
        head = [TopLogprob(token=f"token_id:{tid}", logprob=lp)]
        if top_n > 1 and tops is not None and k < len(tops):
            head += [TopLogprob(token=f"token_id:{a}", logprob=max(alp, -9999.0))
                     for a, alp in tops[k] if a != tid][: top_n - 1]
        content.append(TokenLogprob(token=f"token_id:{tid}", logprob=lp, top_logprobs=head))
    return ChoiceLogprobs(content=content)


def _finish(out_finish) -> str | None:
    return None if out_finish is None else out_finish.type


def response(p: TokensPlan, outs: list[SequenceOutput]) -> dict:
    choices = [
        TokenGenerateChoice(index=k, token_ids=list(o.output_ids), finish_reason=_finish(o.finish),
                            logprobs=logprobs(o.output_ids, o.logprobs, o.top_logprobs, p.top_n)
                            if p.top_n is not None else None)
        for k, o in enumerate(outs)
    ]
    completion = sum(len(o.output_ids) for o in outs)
    body = TokenGenerateResponse(
        request_id=p.id, choices=choices,
        usage=TokenUsage(prompt_tokens=len(p.prompt), completion_tokens=completion, total_tokens=len(p.prompt) + completion),
        prompt_token_ids=p.prompt if p.request.return_token_ids else None,
        weight_version=str(max((o.weight_version for o in outs), default=0)),
    )
    return body.model_dump()


async def sse_chunks(p: TokensPlan, deltas: AsyncIterator,
                     on_finish: Callable[[int, None], None] | None = None) -> AsyncIterator[bytes]:
    """vLLM's stream: a chunk per delta with new tokens, a usage chunk if asked, then ``[DONE]``.
    ``on_finish(k, None)`` runs when sequence ``k`` ended, before its last chunk is sent."""
    opts = p.request.stream_options
    generated = [0] * len(p.seqs)
    async for k, d in deltas:
        generated[k] += len(d.token_ids)
        if d.finish is not None and on_finish is not None:
            on_finish(k, None)
        if not d.token_ids and d.finish is None:
            continue
        lp = logprobs(d.token_ids, d.logprobs, d.top_logprobs, p.top_n) if p.top_n is not None else None
        chunk: dict[str, Any] = {"request_id": p.id, "choices": [TokenGenerateChoice(
            index=k, token_ids=list(d.token_ids), finish_reason=_finish(d.finish), logprobs=lp).model_dump()]}
        if opts is not None and opts.include_usage and opts.continuous_usage_stats:
            chunk["usage"] = _usage(len(p.prompt), generated[k])
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    if opts is not None and opts.include_usage:
        yield f"data: {json.dumps({'request_id': p.id, 'choices': [], 'usage': _usage(len(p.prompt), sum(generated))})}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
