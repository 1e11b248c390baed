"""``POST /generate`` (SGLang-compatible)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.rollout.deps import ServiceDep
from services.rollout.protocols import sglang as protocol_sglang
from services.rollout.routes.streaming import GENERATION_ERRORS, SSE_OK, sse_response, until_disconnect
from shared.generate_api import GenerateRequest, GenerateResponse

router = APIRouter(tags=["generate"])


@router.post("/generate", response_model=GenerateResponse | list[GenerateResponse],
             responses={**SSE_OK, **GENERATION_ERRORS})
async def generate(body: GenerateRequest, request: Request, service: ServiceDep):
    """One result, or a list (a batch, or ``n > 1``); with ``stream`` an SSE stream of chunks."""
    plan = await protocol_sglang.plan(service, body)
    if plan.prompts_only is not None:  # max_new_tokens=0: nothing to generate
        if body.stream:
            return await sse_response(protocol_sglang.prompt_only_deltas(plan),
                                      lambda d: protocol_sglang.sse_chunks(service, plan, d))
        return JSONResponse(protocol_sglang.response(service, plan, protocol_sglang.prompt_only_outputs(service, plan)))
    if body.stream:
        return await sse_response(service.stream(plan.seqs), lambda d: protocol_sglang.sse_chunks(service, plan, d))
    outs = await until_disconnect(request, service.generate(plan.seqs))
    return JSONResponse(protocol_sglang.response(service, plan, outs))  # built by the protocol: no re-validation
