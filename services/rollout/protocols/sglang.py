"""``/generate`` (SGLang) <-> engine sequences: request mapping, response and stream-chunk building."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from services.rollout.engines.types import (
    Finish,
    Grammar,
    SamplingParams,
    SequenceDelta,
    SequenceOutput,
    SequenceRequest,
)
from services.rollout.errors import RequestError
from services.rollout.service import RolloutService, new_request_id
from shared.generate_api import GenerateRequest, GenerateResponse, MetaInfo, SamplingParamsIn


@dataclass
class GeneratePlan:
    """A /generate request turned into sequences, plus what the response needs to echo."""

    request: GenerateRequest
    seqs: list[SequenceRequest]
    ids: list[str]  # meta_info.id per sequence
    started: float
    prompts_only: list[list[int]] | None = None  # max_new_tokens=0: no sequence runs; the prompts to answer for
    #: per prompt, (logprob, token id) of its tokens from logprob_start_len on (None: not asked for)
    input_logprobs: list[list[tuple[float | None, int]]] | None = None

    @property
    def as_list(self) -> bool:
        return self.request.is_batch or self.request.sampling_params.n > 1


def _stops(sp: SamplingParamsIn) -> list[str]:
    return sp.stop if isinstance(sp.stop, list) else ([sp.stop] if sp.stop else [])


def sampling_params(sp: SamplingParamsIn, max_new_tokens: int, top_logprobs: int) -> SamplingParams:
    stop = _stops(sp)
    grammar = sp.grammar()
    return SamplingParams(
        max_new_tokens=max_new_tokens, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
        stop=tuple(stop), stop_token_ids=tuple(sp.stop_token_ids or ()), ignore_eos=sp.ignore_eos,
        skip_special_tokens=sp.skip_special_tokens, no_stop_trim=sp.no_stop_trim, seed=sp.sampling_seed,
        top_logprobs=top_logprobs, min_new_tokens=min(sp.min_new_tokens, max_new_tokens),
        stop_regex=tuple(sp.stop_regex_list()), spaces_between_special_tokens=sp.spaces_between_special_tokens,
        frequency_penalty=sp.frequency_penalty, presence_penalty=sp.presence_penalty,
        repetition_penalty=sp.repetition_penalty, grammar=Grammar(*grammar) if grammar else None,
    )


async def plan(service: RolloutService, req: GenerateRequest) -> GeneratePlan:
    sp = req.sampling_params
    service.check_upstream(req.unhonoured())
    service.check_stop_ids(sp.stop_token_ids)
    service.check_stops(_stops(sp))
    prompts = await service.encode_all(req.prompts_raw())
    params = []
    for i, ids in enumerate(prompts):
        what = "prompt" if len(prompts) == 1 else f"prompt {i}"
        if "max_new_tokens" in sp.model_fields_set or not sp.max_new_tokens:
            budget = service.check_prompt(ids, sp.max_new_tokens or None, what)
        else:  # SGLang's default 128, cut to what the context leaves as SGLang's scheduler cuts it (not a 400
            budget = min(sp.max_new_tokens, service.check_prompt(ids, None, what))  # for a setting never sent)
        params.append(sampling_params(sp, budget, req.top_logprobs_num))
    input_lps = await _input_logprobs(service, req, prompts) if req.return_logprob and req.logprob_start_len >= 0 \
        else None
    if sp.max_new_tokens == 0:  # SGLang's prefix caching (its frontend's cache_prefix): the prompt, no output
        for p in params:  # the request is still checked as a whole, as it would be if it ran
            service.check_features(p)
        return GeneratePlan(req, [], _ids(req, new_request_id(), len(prompts), sp.n), time.monotonic(),
                            prompts_only=prompts, input_logprobs=input_lps)
    rid = new_request_id()
    seqs = service.sequences(prompts, params, sp.n, req.stream, rid)
    return GeneratePlan(req, seqs, _ids(req, rid, len(prompts), sp.n), time.monotonic(), input_logprobs=input_lps)


async def _input_logprobs(service: RolloutService, req: GenerateRequest,
                          prompts: list[list[int]]) -> list[list[tuple[float | None, int]]]:
    """SGLang's ``input_token_logprobs`` (what its frontend's ``select`` scores choices by): the serving engine's
    logprob of each prompt token from ``logprob_start_len`` on, computed before the request generates."""
    start = req.logprob_start_len
    if not service.engine.scores_prompts:
        raise RequestError(f"logprob_start_len={start}: the `{service.engine.kind}` engine serving this model gives "
                           "no prompt logprobs (leave it at -1)")
    for i, ids in enumerate(prompts):
        if start > len(ids):
            what = "the prompt" if len(prompts) == 1 else f"prompt {i}"
            raise RequestError(f"logprob_start_len={start}: more than the {len(ids)} tokens of {what}")
    out = []
    for ids in prompts:
        lps = await service.engine.prompt_logprobs(ids, start, admit_timeout=service.limits.pause_wait_s)
        out.append(list(zip(lps, ids[start:])))
    return out


def _ids(req: GenerateRequest, rid: str, prompts: int, n: int) -> list[str]:
    """meta_info.id of each sequence (prompt-major)."""
    if isinstance(req.rid, list):
        per_prompt = req.rid
    else:
        base = req.rid or rid
        per_prompt = [f"{base}-{i}" for i in range(prompts)] if req.is_batch else [base]
    return [per_prompt[k // n] if n == 1 else f"{per_prompt[k // n]}-{k % n}" for k in range(prompts * n)]


async def prompt_only_deltas(p: GeneratePlan) -> AsyncGenerator[tuple[int, SequenceDelta], None]:
    """A ``max_new_tokens=0`` plan's answers as the engine would give them: no token, finish length 0."""
    for k in range(len(p.ids)):
        yield k, SequenceDelta([], [], "", Finish("length", length=0))


def prompt_only_outputs(service: RolloutService, p: GeneratePlan) -> list[SequenceOutput]:
    n = p.request.sampling_params.n
    prompts = p.prompts_only
    if prompts is None:
        raise ValueError("prompt_only_outputs: the plan has sequences to generate")
    return [SequenceOutput(rid=p.ids[k], prompt_ids=tuple(prompts[k // n]), finish=Finish("length", length=0),
                           weight_version=service.engine.weight_version) for k in range(len(p.ids))]


def _logprob_triples(service: RolloutService, ids: list[int], lps: list[float], with_text: bool):
    return [(lp, tid, service.token_text(tid) if with_text else None) for lp, tid in zip(lps, ids)]


def _meta(service: RolloutService, p: GeneratePlan, k: int, out: SequenceOutput, final: bool) -> MetaInfo:
    req = p.request
    meta = MetaInfo(
        id=p.ids[k],
        prompt_tokens=len(out.prompt_ids),
        completion_tokens=len(out.output_ids),
        finish_reason=out.finish.to_wire() if (final and out.finish is not None) else None,
        weight_version=str(service.engine.weight_version if not final else out.weight_version),
        weight_version_spans=out.version_spans if final and out.version_spans and len(out.version_spans) > 1 else None,
        e2e_latency=round(time.monotonic() - p.started, 6) if final else None,
    )
    if req.return_logprob:
        meta.output_token_logprobs = _logprob_triples(service, out.output_ids, out.logprobs, req.return_text_in_logprobs)
        if p.input_logprobs is not None:
            meta.input_token_logprobs = [(lp, tid, service.token_text(tid) if req.return_text_in_logprobs else None)
                                         for lp, tid in p.input_logprobs[k // req.sampling_params.n]]
        if req.top_logprobs_num and out.top_logprobs is not None:
            meta.output_top_logprobs = [
                [(lp, tid, service.token_text(tid) if req.return_text_in_logprobs else None) for tid, lp in row]
                for row in out.top_logprobs
            ]
    return meta


def response(service: RolloutService, p: GeneratePlan, outs: list[SequenceOutput]) -> list[dict] | dict:
    items = [
        GenerateResponse(text=o.text, output_ids=o.output_ids, meta_info=_meta(service, p, k, o, True)).model_dump(
            exclude_none=True)
        for k, o in enumerate(outs)
    ]
    for item, o in zip(items, outs):
        item["meta_info"]["finish_reason"] = o.finish.to_wire() if o.finish else None
    return items if p.as_list else items[0]


async def sse_chunks(service: RolloutService, p: GeneratePlan, deltas: AsyncIterator) -> AsyncIterator[bytes]:
    """SSE ``data: {json}`` chunks, SGLang style (cumulative text / ids unless incremental), then ``[DONE]``."""
    incremental = service.settings.incremental_streaming_output
    if p.prompts_only is not None:
        state = [SequenceOutput(rid=o.rid, prompt_ids=o.prompt_ids) for o in prompt_only_outputs(service, p)]
    else:
        state = [SequenceOutput(rid=s.rid, prompt_ids=s.prompt_ids) for s in p.seqs]
    sent = [0] * len(state)
    async for k, delta in deltas:
        out = state[k]
        text_before = len(out.text)
        out.add(delta)
        final = delta.finish is not None
        if final:
            spans = out.version_spans
            out.weight_version = min(v for _, v in spans) if spans else service.engine.weight_version
        meta = _meta(service, p, k, out, final)
        if incremental:
            start = sent[k]
            chunk = {"text": out.text[text_before:], "output_ids": out.output_ids[start:]}
            if meta.output_token_logprobs is not None:
                meta.output_token_logprobs = meta.output_token_logprobs[start:]
            if meta.output_top_logprobs is not None:
                meta.output_top_logprobs = meta.output_top_logprobs[start:]
            sent[k] = len(out.output_ids)
        else:
            chunk = {"text": out.text, "output_ids": list(out.output_ids)}
        chunk["meta_info"] = meta.model_dump(exclude_none=True)
        chunk["meta_info"]["finish_reason"] = meta.finish_reason
        if p.as_list:
            chunk["index"] = k
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"
