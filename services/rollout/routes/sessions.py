"""Session routes: the lifecycle (control plane, bearer token) and the OpenAI / token-in routes scoped to a
session, so an agent records its calls by pointing its client's ``base_url`` at ``/sessions/{id}/v1``.

    POST   /sessions                                  create             (control)
    GET    /sessions/{id}                             state              (control)
    POST   /sessions/{id}/finish                      reward -> experiences (control)
    DELETE /sessions/{id}                             drop               (control)
    POST   /sessions/{id}/v1/chat/completions         recorded call        (the session's key or the control token)
    POST   /sessions/{id}/v1/completions              recorded call        (idem)
    GET    /sessions/{id}/v1/models                   the model card (max_model_len) (idem)
    POST   /sessions/{id}/inference/v1/generate       recorded call (vLLM token-in / token-out) (idem)

With several replicas, a session lives on the one that opened it (``replica_url`` in the create reply). Another
replica answers its calls 307 to the same path there, and forwards its lifecycle requests there (the bearer token
would not survive a redirect to another host) and answers what the owner answers.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from services.rollout.deps import ControlDep, ServiceDep
from services.rollout.routes import recording
from services.rollout.routes.inference import SESSION_ELSEWHERE, generate_tokens
from services.rollout.routes.openai import chat_in, completion_in, model_list
from services.rollout.routes.streaming import SSE_OK
from services.rollout.sessions.registry import FORWARDED_HEADER, SessionElsewhere
from services.rollout.sessions.store import Session
from shared.generate_api import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
)
from shared.inference_api import GENERATE_PATH, TokenGenerateRequest, TokenGenerateResponse
from shared.service_kit.openapi import error_responses
from shared.session_api import SESSION_ID_PATTERN, SessionCreate, SessionFinish, SessionFinished, SessionInfo

control = APIRouter(prefix="/sessions", tags=["sessions"], dependencies=[ControlDep])
scoped = APIRouter(prefix="/sessions/{session_id}", tags=["sessions"])
SessionId = Annotated[str, Path(pattern=SESSION_ID_PATTERN, description="The session's id.")]
CALL_ERRORS = {**SSE_OK, **error_responses(401, 403, 404, 409, 429, 503), **SESSION_ELSEWHERE}
# 401 / 403: the session's key or the control token (sessions/auth.py)  # with `stream`: SSE
LIFECYCLE_ERRORS = error_responses(404, 409, 503)  # 503: redis, or the replica holding the session, unavailable


async def _here(request: Request, service, session_id: str) -> Session | Response:
    """The session, when this replica holds it; else the owner's answer to this request, forwarded."""
    sessions = recording.manager(service)
    try:
        return await sessions.locate(session_id, forwarded=FORWARDED_HEADER.lower() in request.headers)
    except SessionElsewhere as exc:
        return await sessions.forward(request, exc.owner)


@control.post("", response_model=SessionInfo, status_code=201, responses=error_responses(404, 409, 429, 503))
async def create_session(body: SessionCreate, request: Request, service: ServiceDep) -> SessionInfo:
    """Open a session; its calls go to ``openai_base_url`` (or carry ``X-Session-ID``), on this replica:
    ``replica_url`` (with several replicas behind a load balancer, send them there, or let them be redirected)."""
    sessions = recording.manager(service)
    sessions.learn_url(request)
    return sessions.info(await sessions.create(body))


@control.get("/{session_id}", response_model=SessionInfo, responses=LIFECYCLE_ERRORS)
async def session_state(session_id: SessionId, request: Request, service: ServiceDep):
    """The session's state (from the replica holding it)."""
    here = await _here(request, service, session_id)
    return here if isinstance(here, Response) else recording.manager(service).info(here)


@control.post("/{session_id}/finish", response_model=SessionFinished, responses=error_responses(404, 409, 422, 503))
async def finish_session(session_id: SessionId, body: SessionFinish, request: Request, service: ServiceDep):
    """Reward the session (given, or scored by the reward service) and push its trajectories as experiences."""
    here = await _here(request, service, session_id)
    return here if isinstance(here, Response) else await recording.manager(service).finish(session_id, body)


@control.delete("/{session_id}", response_model=SessionInfo, responses=LIFECYCLE_ERRORS)
async def delete_session(session_id: SessionId, request: Request, service: ServiceDep):
    """Drop the session: nothing is pushed."""
    here = await _here(request, service, session_id)
    return here if isinstance(here, Response) else await recording.manager(service).delete(session_id)


@scoped.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=CALL_ERRORS)
async def session_chat(session_id: SessionId, body: ChatCompletionRequest, request: Request, service: ServiceDep):
    return await chat_in(body, request, service, await recording.session_named(service, request, path_id=session_id))


@scoped.post("/v1/completions", response_model=CompletionResponse, responses=CALL_ERRORS)
async def session_completion(session_id: SessionId, body: CompletionRequest, request: Request, service: ServiceDep):
    return await completion_in(body, request, service, await recording.session_named(service, request, path_id=session_id))


@scoped.post(GENERATE_PATH, response_model=TokenGenerateResponse, responses=CALL_ERRORS)
async def session_generate(session_id: SessionId, body: TokenGenerateRequest, request: Request, service: ServiceDep):
    return await generate_tokens(body, request, service, await recording.session_named(service, request, path_id=session_id))


@scoped.get("/v1/models", response_model=ModelList,
            responses={**error_responses(401, 403, 404, 409, 503), **SESSION_ELSEWHERE})
async def session_models(session_id: SessionId, request: Request, service: ServiceDep) -> ModelList:
    await recording.session_named(service, request, path_id=session_id)
    return model_list(service)
