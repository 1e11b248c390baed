"""``POST /generate`` (SGLang-compatible)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.rollout import protocol_sglang
from services.rollout.deps import ServiceDep
from services.rollout.routes.streaming import sse_response, until_disconnect
from shared.generate_api import GenerateRequest

router = APIRouter(tags=["generate"])


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request, service: ServiceDep):
    plan = protocol_sglang.plan(service, body)
    if body.stream:
        return await sse_response(service.stream(plan.seqs), lambda d: protocol_sglang.sse_chunks(service, plan, d))
    outs = await until_disconnect(request, service.generate(plan.seqs))
    return JSONResponse(protocol_sglang.response(service, plan, outs))
