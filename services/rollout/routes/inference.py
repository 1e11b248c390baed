"""vLLM's token-in / token-out ``POST /inference/v1/generate`` (at the server root, as vLLM serves it).

With an ``X-Session-ID`` header naming a session (session mode on), the call is recorded in it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response

from services.rollout.deps import ServiceDep
from services.rollout.protocols import tokens as protocol_tokens
from services.rollout.routes import recording
from services.rollout.routes.streaming import GENERATION_ERRORS, SSE_OK, sse_response, until_disconnect
from shared.inference_api import GENERATE_PATH, SESSION_ID_HEADER, TokenGenerateRequest, TokenGenerateResponse
from shared.service_kit.envelope import ErrorResponse
from shared.service_kit.openapi import Responses, error_responses
from shared.session_api import SESSION_ID_PATTERN

router = APIRouter(tags=["inference"])
SESSION_ELSEWHERE: Responses = {307: {
    "model": ErrorResponse,
    "description": "The session is held by another rollout replica: the same request again at `Location` (the "
                   "OpenAI client follows it; so does httpx with follow_redirects). `X-Session-Replica` names that "
                   "replica's base URL.",
    "headers": {"Location": {"schema": {"type": "string"}, "description": "This path on the session's replica."},
                "X-Session-Replica": {"schema": {"type": "string"}, "description": "That replica's base URL."}},
}}
ERRORS = {**SSE_OK, **GENERATION_ERRORS, **error_responses(401, 403, 404, 409), **SESSION_ELSEWHERE}
# 404: model / session; 409: session finished; 307: the session is on another replica; 401 / 403: a session
# named without its key or the control token
SessionHeader = Annotated[str | None, Header(
    alias=SESSION_ID_HEADER, pattern=SESSION_ID_PATTERN,
    description="Record the call in this session (an id as POST /sessions takes: 1-128 of A-Z a-z 0-9 _ . : -).")]
"""The ``X-Session-ID`` header of every generation route: its format is checked here, once (400 naming it)."""


async def generate_tokens(body: TokenGenerateRequest, request: Request, service, session) -> Response:
    if session is not None:
        return await recording.tokens(service, request, body, session)
    plan = protocol_tokens.plan(service, body)
    if body.stream:
        return await sse_response(service.stream(plan.seqs), lambda d: protocol_tokens.sse_chunks(plan, d))
    outs = await until_disconnect(request, service.generate(plan.seqs))
    return JSONResponse(protocol_tokens.response(plan, outs))


@router.post(GENERATE_PATH, response_model=TokenGenerateResponse, responses=ERRORS)
async def inference_generate(body: TokenGenerateRequest, request: Request, service: ServiceDep,
                             x_session_id: SessionHeader = None):
    """Token ids in, token ids (and logprobs) out; vLLM's request and reply shapes."""
    return await generate_tokens(body, request, service,
                                 await recording.session_named(service, request, header_id=x_session_id))
