"""A generation call made in a session: planned like any other, run, then recorded (one call at a time).

The routes call these instead of the plain protocol path when a session is named (path or ``X-Session-ID``).
A session call generates one sequence (``n`` = 1, one prompt): a session is one conversation, recorded as
the engine produced it.

``stream: true`` streams the call as the plain route does (SSE; with tools declared, ``delta.tool_calls``) and
records it once its sequence has ended, before the last chunk is sent, exactly as the same call unstreamed
would be recorded (the engine's ids, logprobs, finish reason, weight version; for chat the assistant message as
the client assembles it from the chunks, so that the next call continues from its ids). The session is held
until then: a client that goes away mid-stream has its generation aborted and nothing recorded, and the
session is free again for the next call or the finish, as if the call had not been made.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from services.rollout.engines.types import SequenceOutput, SequenceRequest
from services.rollout.errors import RequestError
from services.rollout.protocols import openai as protocol_openai
from services.rollout.protocols import tokens as protocol_tokens
from services.rollout.routes.streaming import sse_response, until_disconnect
from services.rollout.service import RolloutService
from services.rollout.sessions.auth import authorize_call
from services.rollout.sessions.chat import continuation, template_key
from services.rollout.sessions.manager import SessionManager
from services.rollout.sessions.store import ChatTurn, Session
from shared.generate_api import ChatCompletionRequest, CompletionRequest
from shared.inference_api import TokenGenerateRequest


def manager(service: RolloutService) -> SessionManager:
    if service.sessions is None:
        raise RequestError("session mode is off on this server (set sessions.enabled, with a redis_url)", status=404)
    return service.sessions


async def session_named(service: RolloutService, request: Request, path_id: str | None = None,
                        header_id: str | None = None) -> Session | None:
    """The session a call names: by path (must exist), else by ``X-Session-ID`` header (see
    ``sessions.unknown_header_id``; ignored, as vLLM does, when session mode is off). A call naming a session
    needs the control token or the session's key (:mod:`.auth`), checked first. A session another replica holds
    raises :class:`~.registry.SessionElsewhere`: a 307 to the same path there."""
    if path_id is not None:
        manager(service)
        authorize_call(request, path_id)
        return await manager(service).locate(path_id)
    if header_id and service.sessions is not None:
        authorize_call(request, header_id)
        return await service.sessions.by_header(header_id)
    return None


def _one(n: int) -> None:
    if n != 1:
        raise RequestError(f"n={n}: a session records one conversation; ask for n=1 (open one session per sample)")


# Record = (the finished sequence, the assistant message streamed (chat) or None) -> None
Record = Callable[[SequenceOutput, "dict | None"], None]
Render = Callable[[AsyncIterator, Callable[[int, "dict | None"], None]], AsyncIterator[bytes]]


async def _run(service: RolloutService, request: Request, seqs: list[SequenceRequest], stream: bool,
               release: Callable[[], None], record: Record, render: Render,
               respond: Callable[[list], tuple[dict, dict | None]]) -> Response:
    """Generate the call's one sequence, record it, answer; ``release`` the session once recorded or failed.
    ``respond``: the unstreamed reply and its assistant message (chat)."""
    if not stream:
        try:
            outs = await until_disconnect(request, service.generate(seqs))
            reply, message = respond(outs)
            record(outs[0], message)
        finally:
            release()
        return JSONResponse(reply)

    seq = seqs[0]
    out = SequenceOutput(rid=seq.rid, prompt_ids=seq.prompt_ids)

    async def gathered() -> AsyncGenerator:
        async with aclosing(service.stream(seqs)) as deltas:
            async for k, d in deltas:
                out.add(d)
                yield k, d

    def finished(_k: int, message: dict | None) -> None:
        out.settle(service.engine.weight_version)
        try:
            record(out, message)
        finally:
            release()

    return await sse_response(gathered(), lambda d: render(d, finished), cleanup=release)


async def chat(service: RolloutService, request: Request, body: ChatCompletionRequest, session: Session) -> Response:
    sessions = manager(service)
    _one(body.n)
    own_template = service.check_template_kwargs(body.chat_template_kwargs)  # a request's own: always rendered (bounded)
    release = sessions.hold(session)
    try:
        messages = protocol_openai.chat_messages(body)
        tools = protocol_openai.chat_tools(body)
        ids = None
        if body.add_generation_prompt and not body.continue_final_message and not own_template:
            ids = await service.off_loop(continuation, session, messages, sessions.chat_tokens, tools,
                                         body.chat_template_kwargs)
        plan = await protocol_openai.plan_chat(service, body, prompt_ids=ids)
        seq = plan.seqs[0]
        sessions.check_sampling(session, list(seq.prompt_ids), seq.params)
    except BaseException:
        release()
        raise

    def record(out: SequenceOutput, message: dict | None) -> None:
        turn = ChatTurn(messages=messages, reply=message or {}, prompt_ids=list(seq.prompt_ids),
                        output_ids=list(out.output_ids), template_key=template_key(tools, body.chat_template_kwargs))
        sessions.record(session, list(seq.prompt_ids), out, seq.params, chat=turn)

    return await _run(service, request, plan.seqs, bool(body.stream), release, record,
                      lambda d, fin: protocol_openai.sse_chunks(service, plan, d, on_finish=fin),
                      lambda outs: _with_message(protocol_openai.response(service, plan, outs)))


def _with_message(reply: dict) -> tuple[dict, dict]:
    return reply, reply["choices"][0]["message"]


async def completion(service: RolloutService, request: Request, body: CompletionRequest, session: Session) -> Response:
    sessions = manager(service)
    _one(body.n)
    if len(body.prompts_raw()) != 1:
        raise RequestError("a session call takes one prompt, not a batch")
    release = sessions.hold(session)
    try:
        plan = await protocol_openai.plan_completion(service, body)
        seq = plan.seqs[0]
        sessions.check_sampling(session, list(seq.prompt_ids), seq.params)
    except BaseException:
        release()
        raise
    return await _run(service, request, plan.seqs, bool(body.stream), release,
                      lambda out, _: sessions.record(session, list(seq.prompt_ids), out, seq.params),
                      lambda d, fin: protocol_openai.sse_chunks(service, plan, d, on_finish=fin),
                      lambda outs: (protocol_openai.response(service, plan, outs), None))


async def tokens(service: RolloutService, request: Request, body: TokenGenerateRequest, session: Session) -> Response:
    sessions = manager(service)
    _one(body.sampling_params.n)
    release = sessions.hold(session)
    try:
        plan = protocol_tokens.plan(service, body)
        seq = plan.seqs[0]
        sessions.check_sampling(session, list(seq.prompt_ids), seq.params)
    except BaseException:
        release()
        raise
    return await _run(service, request, plan.seqs, bool(body.stream), release,
                      lambda out, _: sessions.record(session, list(seq.prompt_ids), out, seq.params),
                      lambda d, fin: protocol_tokens.sse_chunks(plan, d, on_finish=fin),
                      lambda outs: (protocol_tokens.response(plan, outs), None))
