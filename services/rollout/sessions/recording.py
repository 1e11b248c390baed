"""A generation call made in a session: planned like any other, run, then recorded (one call at a time).

The routes call these instead of the plain protocol path when a session is named (path or ``X-Session-ID``).
A session call generates one sequence (``n`` = 1, one prompt) and does not stream: a session is one
conversation, recorded as the engine produced it.
"""

from __future__ import annotations

from fastapi import Request

from services.rollout import protocol_openai, protocol_tokens
from services.rollout.errors import RequestError
from services.rollout.routes.streaming import until_disconnect
from services.rollout.service import RolloutService
from services.rollout.sessions.chat import continuation, template_key
from services.rollout.sessions.manager import SessionManager
from services.rollout.sessions.store import ChatTurn, Session
from shared.generate_api import ChatCompletionRequest, CompletionRequest
from shared.inference_api import TokenGenerateRequest


def manager(service: RolloutService) -> SessionManager:
    if service.sessions is None:
        raise RequestError("session mode is off on this server (set sessions.enabled, with a redis_url)", status=404)
    return service.sessions


def session_named(service: RolloutService, path_id: str | None = None, header_id: str | None = None) -> Session | None:
    """The session a call names: by path (must exist), else by ``X-Session-ID`` header (see
    ``sessions.unknown_header_id``; ignored, as vLLM does, when session mode is off)."""
    if path_id is not None:
        return manager(service).get(path_id)
    if header_id and service.sessions is not None:
        return service.sessions.by_header(header_id)
    return None


def _one(n: int, stream: bool | None) -> None:
    if n != 1:
        raise RequestError(f"n={n}: a session records one conversation; ask for n=1 (open one session per sample)")
    if stream:
        raise RequestError("stream=true is not supported in a session: send stream=false")


async def chat(service: RolloutService, request: Request, body: ChatCompletionRequest, session: Session) -> dict:
    sessions = manager(service)
    _one(body.n, body.stream)
    async with sessions.call(session):
        messages = protocol_openai.chat_messages(body)
        tools = protocol_openai.chat_tools(body)
        ids = None
        if body.add_generation_prompt and not body.continue_final_message:
            ids = continuation(session, messages, sessions.chat_tokens, tools, body.chat_template_kwargs)
        plan = protocol_openai.plan_chat(service, body, prompt_ids=ids)
        seq = plan.seqs[0]
        sessions.check_sampling(session, list(seq.prompt_ids), seq.params)
        outs = await until_disconnect(request, service.generate(plan.seqs))
        reply = protocol_openai.response(service, plan, outs)
        turn = ChatTurn(messages=messages, reply=reply["choices"][0]["message"], prompt_ids=list(seq.prompt_ids),
                        output_ids=list(outs[0].output_ids), template_key=template_key(tools, body.chat_template_kwargs))
        sessions.record(session, list(seq.prompt_ids), outs[0], seq.params, chat=turn)
    return reply


async def completion(service: RolloutService, request: Request, body: CompletionRequest, session: Session) -> dict:
    sessions = manager(service)
    _one(body.n, body.stream)
    if len(body.prompts_raw()) != 1:
        raise RequestError("a session call takes one prompt, not a batch")
    async with sessions.call(session):
        plan = protocol_openai.plan_completion(service, body)
        seq = plan.seqs[0]
        sessions.check_sampling(session, list(seq.prompt_ids), seq.params)
        outs = await until_disconnect(request, service.generate(plan.seqs))
        sessions.record(session, list(seq.prompt_ids), outs[0], seq.params)
    return protocol_openai.response(service, plan, outs)


async def tokens(service: RolloutService, request: Request, body: TokenGenerateRequest, session: Session) -> dict:
    sessions = manager(service)
    _one(body.sampling_params.n, body.stream)
    async with sessions.call(session):
        plan = protocol_tokens.plan(service, body)
        seq = plan.seqs[0]
        sessions.check_sampling(session, list(seq.prompt_ids), seq.params)
        outs = await until_disconnect(request, service.generate(plan.seqs))
        sessions.record(session, list(seq.prompt_ids), outs[0], seq.params)
    return protocol_tokens.response(plan, outs)
