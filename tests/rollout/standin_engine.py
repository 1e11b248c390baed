"""A stand-in engine server speaking the documented SGLang and vLLM HTTP protocols (its own process).

Deterministic: token ``i`` of a reply is ``5 + (sum(prompt) + 7 * i) % 250`` with logprob
``-(i + 1) / 10``, until a stop token id or ``max_new_tokens`` / ``max_tokens``. Request bodies are
validated strictly (unknown fields -> 400), so a mapping error in FleetRL's adapters shows up. The
last body per route is kept at ``GET /_last/{route}`` for assertions.

    python -m tests.rollout.standin_engine --port 31000
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SGLSampling(_S):
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    # SGLang 0.5.23's optional features (FleetRL sends them only when a request uses them)
    min_new_tokens: int = 0
    stop_regex: list[str] | str | None = None
    spaces_between_special_tokens: bool = True
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None


class SGLGenerate(_S):
    input_ids: list[int]
    sampling_params: SGLSampling
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    rid: str | None = None


class VCompletion(_S):
    model: str
    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    n: int = 1
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    seed: int | None = None
    # vLLM 0.33's optional features (FleetRL sends them only when a request uses them)
    min_tokens: int = 0
    spaces_between_special_tokens: bool = True
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    structured_outputs: dict | None = None
    prompt_logprobs: int | None = None  # per prompt token {token id: {logprob, rank, decoded_token}}, null first


def tokens_for(prompt: list[int], limit: int, stop_ids: list[int]) -> tuple[list[int], list[float], dict]:
    ids, lps = [], []
    for i in range(limit):
        t = 5 + (sum(prompt) + 7 * i) % 250
        ids.append(t)
        lps.append(-(i + 1) / 10)
        if t in stop_ids:
            return ids, lps, {"type": "stop", "matched": t}
    return ids, lps, {"type": "length", "length": limit}


def text_of(ids: list[int]) -> str:
    return "".join(f"t{t} " for t in ids)


app = FastAPI()
LAST: dict[str, dict] = {}


@app.get("/_last/{route}")
async def last(route: str):
    return LAST.get(route, {})


@app.get("/health")
@app.get("/health_generate")
async def health():
    return {}


@app.get("/model_info")
async def model_info():
    return {"model_path": "standin", "weight_version": "3"}


@app.get("/weight_info")
async def weight_info():  # vLLM 0.33 (dev mode): the version /finish_weight_update last set
    return {"weight_version": "5"}


@app.post("/abort_request")
async def abort_request(body: dict):
    LAST["abort_request"] = body
    return {"success": True}


@app.post("/generate")
async def generate(body: SGLGenerate):
    LAST["generate"] = body.model_dump(exclude_unset=True)  # what FleetRL sent, no defaults
    sp = body.sampling_params
    ids, lps, finish = tokens_for(body.input_ids, sp.max_new_tokens, sp.stop_token_ids or [])

    def meta(k: int, final: bool) -> dict:
        m = {"id": body.rid, "prompt_tokens": len(body.input_ids), "completion_tokens": k,
             "finish_reason": finish if final else None, "weight_version": "3"}
        if body.return_logprob:
            m["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps[:k], ids[:k])]
            start = body.logprob_start_len if body.logprob_start_len >= 0 else len(body.input_ids)
            # SGLang's input_token_logprobs: position 0 has no context (None); here lp(t_i) = -t_i / 1000
            m["input_token_logprobs"] = [[None if i == 0 else -t / 1000, t, None]
                                         for i, t in enumerate(body.input_ids) if i >= start]
            if body.top_logprobs_num:
                m["output_top_logprobs"] = [[[lp, t, None]] for lp, t in zip(lps[:k], ids[:k])]
        return m

    if not body.stream:
        return {"text": text_of(ids), "output_ids": ids, "meta_info": meta(len(ids), True)}

    async def chunks():
        for k in range(1, len(ids) + 1):  # SGLang's default: cumulative text and ids
            await asyncio.sleep(0.001)
            out = {"text": text_of(ids[:k]), "output_ids": ids[:k], "meta_info": meta(k, k == len(ids))}
            yield f"data: {json.dumps(out)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


@app.post("/v1/completions")
async def completions(body: VCompletion):
    LAST["completions"] = body.model_dump(exclude_unset=True)
    if body.n != 1 or not body.return_token_ids:
        return JSONResponse({"error": "adapter must send n=1 and return_token_ids"}, status_code=400)
    ids, lps, finish = tokens_for(body.prompt, body.max_tokens, body.stop_token_ids)
    reason = "stop" if finish["type"] == "stop" else "length"

    def choice(sl: slice, final: bool) -> dict:
        part = ids[sl]
        c = {"index": 0, "text": text_of(part), "token_ids": part, "finish_reason": reason if final else None,
             "stop_reason": finish.get("matched") if final else None}
        if body.prompt_logprobs is not None:  # here lp(t_i) = -t_i / 1000, as the SGLang side
            c["prompt_logprobs"] = [None if i == 0 else {str(t): {"logprob": -t / 1000, "rank": 1,
                                                                  "decoded_token": f"t{t}"}}
                                    for i, t in enumerate(body.prompt)]
        if body.logprobs is not None:
            c["logprobs"] = {"tokens": [f"token_id:{t}" for t in part], "token_logprobs": lps[sl],
                             "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(part, lps[sl])] if body.logprobs else None,
                             "text_offset": [0] * len(part)}
        return c

    if not body.stream:
        return {"id": "cmpl-x", "object": "text_completion", "model": body.model, "choices": [choice(slice(None), True)],
                "usage": {"prompt_tokens": len(body.prompt), "completion_tokens": len(ids), "total_tokens": 0}}

    async def chunks():
        for k in range(len(ids)):
            await asyncio.sleep(0.001)
            out = {"id": "cmpl-x", "object": "text_completion", "model": body.model,
                   "choices": [choice(slice(k, k + 1), k == len(ids) - 1)]}
            yield f"data: {json.dumps(out)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
