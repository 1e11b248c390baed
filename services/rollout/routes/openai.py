"""OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` (and one model's card)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.rollout.deps import ServiceDep
from services.rollout.protocols import openai as protocol_openai
from services.rollout.routes import recording
from services.rollout.routes.inference import SESSION_ELSEWHERE, SessionHeader
from services.rollout.routes.streaming import GENERATION_ERRORS, SSE_OK, sse_response, until_disconnect
from shared.generate_api import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from shared.service_kit.openapi import error_responses

router = APIRouter(prefix="/v1", tags=["openai"])
ERRORS = {**SSE_OK, **GENERATION_ERRORS, **error_responses(401, 403, 404, 409), **SESSION_ELSEWHERE}
# 404: the model or session; 409: session finished; 307: the X-Session-ID session is on another replica;
# 401 / 403: a session named without its key or the control token


async def _run(plan, request: Request, service):
    if plan.request.stream:
        return await sse_response(service.stream(plan.seqs), lambda d: protocol_openai.sse_chunks(service, plan, d))
    outs = await until_disconnect(request, service.generate(plan.seqs))
    return JSONResponse(protocol_openai.response(service, plan, outs))  # built by the protocol: no re-validation


async def completion_in(body: CompletionRequest, request: Request, service, session):
    if session is not None:
        return await recording.completion(service, request, body, session)
    return await _run(await protocol_openai.plan_completion(service, body), request, service)


async def chat_in(body: ChatCompletionRequest, request: Request, service, session):
    service.check_template_kwargs(body.chat_template_kwargs)  # before anything renders, a session's path included
    if session is not None:
        return await recording.chat(service, request, body, session)
    return await _run(await protocol_openai.plan_chat(service, body), request, service)


@router.post("/completions", response_model=CompletionResponse, responses=ERRORS)
async def completions(body: CompletionRequest, request: Request, service: ServiceDep, x_session_id: SessionHeader = None):
    return await completion_in(body, request, service, await recording.session_named(service, request, header_id=x_session_id))


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses=ERRORS)
async def chat_completions(body: ChatCompletionRequest, request: Request, service: ServiceDep,
                           x_session_id: SessionHeader = None):
    return await chat_in(body, request, service, await recording.session_named(service, request, header_id=x_session_id))


def model_list(service) -> ModelList:
    card = ModelCard(id=service.settings.model_name, created=service.started_at, root=service.settings.model,
                     max_model_len=service.engine.context_length)
    return ModelList(data=[card])


@router.get("/models", response_model=ModelList)
async def models(service: ServiceDep) -> ModelList:
    return model_list(service)


@router.get("/models/{model:path}", response_model=ModelCard, responses=error_responses(404))
async def model_card(model: str, service: ServiceDep) -> ModelCard:
    """OpenAI's ``GET /v1/models/{model}`` (``client.models.retrieve``): the served model's card, 404 for another
    name (it was a bare 404 "Not Found" for every name, the served one included)."""
    protocol_openai.check_model(service, model)
    return model_list(service).data[0]
