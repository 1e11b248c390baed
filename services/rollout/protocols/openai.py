"""OpenAI ``/v1/completions`` and ``/v1/chat/completions`` <-> engine sequences (with vLLM's extras)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from services.rollout.agents.tool_calls import ToolCall, ToolCallStream, parse_tool_calls
from services.rollout.engines.types import Grammar, SamplingParams, SequenceOutput, SequenceRequest
from services.rollout.errors import RequestError
from services.rollout.service import RolloutService, new_request_id
from shared.generate_api import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    TokenLogprob,
    TopLogprob,
    Usage,
)

Req = CompletionRequest | ChatCompletionRequest


@dataclass
class OpenAIPlan:
    request: Req
    chat: bool
    seqs: list[SequenceRequest]
    prompts: list[list[int]]
    id: str
    created: int
    model: str
    top_n: int  # top alternatives per token (0 = none)
    want_logprobs: bool
    tool_parser: str | None = None  # chat: read tool calls from the text in this format
    forced_tool: str | None = None  # chat: the reply is this tool's arguments (JSON), or "required": [{name, parameters}]
    messages: list[dict] | None = None  # chat: the messages as rendered


def check_model(service: RolloutService, model: str | None) -> str:
    served = service.settings.model_name
    if model is not None and model not in (served, service.settings.model):
        raise RequestError(f"model {model!r} is not served here; this server serves {served!r}", status=404)
    return served


def _stop(r: Req) -> list[str]:
    return [r.stop] if isinstance(r.stop, str) else list(r.stop or [])


def _params(service: RolloutService, r: Req, ids: list[int], max_tokens: int | None, top_n: int, what: str) -> SamplingParams:
    budget = service.check_prompt(ids, max_tokens, what)
    grammar = r.grammar()
    return SamplingParams(
        max_new_tokens=budget, temperature=r.temperature, top_p=r.top_p,
        top_k=r.top_k, min_p=r.min_p, stop=tuple(_stop(r)), stop_token_ids=tuple(r.stop_token_ids or ()),
        ignore_eos=r.ignore_eos, skip_special_tokens=r.skip_special_tokens,
        no_stop_trim=r.include_stop_str_in_output, seed=r.seed, top_logprobs=top_n,
        min_new_tokens=min(r.min_tokens, budget), spaces_between_special_tokens=r.spaces_between_special_tokens,
        frequency_penalty=r.frequency_penalty, presence_penalty=r.presence_penalty,
        repetition_penalty=r.repetition_penalty, grammar=Grammar(*grammar) if grammar else None,
    )


async def plan_completion(service: RolloutService, r: CompletionRequest) -> OpenAIPlan:
    model = check_model(service, r.model)
    service.check_upstream(r.unhonoured())
    service.check_stop_ids(r.stop_token_ids)
    service.check_stops(_stop(r))
    prompts = await service.encode_all(r.prompts_raw())
    top_n = r.logprobs or 0
    params = [_params(service, r, ids, r.max_tokens, top_n, "prompt" if len(prompts) == 1 else f"prompt {i}")
              for i, ids in enumerate(prompts)]
    rid = new_request_id()
    seqs = service.sequences(prompts, params, r.n, r.stream, rid)
    return OpenAIPlan(r, False, seqs, prompts, f"cmpl-{rid}", int(time.time()), model, top_n, r.logprobs is not None)


def chat_messages(r: ChatCompletionRequest) -> list[dict]:
    """The request's messages as the chat template takes them."""
    messages = []
    for m in r.messages:
        msg = {"role": m.role, "content": m.text()}
        for key in ("name", "tool_call_id", "tool_calls"):
            if getattr(m, key) is not None:
                msg[key] = getattr(m, key)
        messages.append(msg)
    return messages


def chat_tools(r: ChatCompletionRequest) -> list[dict] | None:
    return r.tools if r.tools and r.tool_choice != "none" else None


async def plan_chat(service: RolloutService, r: ChatCompletionRequest,
                    prompt_ids: list[int] | None = None) -> OpenAIPlan:
    """``prompt_ids``: the prompt already built (a session continuing its exact ids); else the template renders it
    (off the event loop)."""
    model = check_model(service, r.model)
    service.check_upstream(r.unhonoured())
    service.check_stop_ids(r.stop_token_ids)
    service.check_stops(_stop(r))
    messages = chat_messages(r)
    tools = chat_tools(r)
    ids = prompt_ids if prompt_ids is not None else await service.chat_prompt(
        messages, add_generation_prompt=r.add_generation_prompt, continue_final_message=r.continue_final_message,
        tools=tools, extra=r.chat_template_kwargs)
    max_tokens = r.max_completion_tokens or r.max_tokens
    top_n = (r.top_logprobs or 0) if r.logprobs else 0
    params = [_params(service, r, ids, max_tokens, top_n, "chat prompt")]
    rid = new_request_id()
    seqs = service.sequences([ids], params, r.n, r.stream, rid)
    forced = r.forced_tool() if tools else None
    if forced is not None:
        await check_tool_schemas(service, r, forced)
    parser = service.settings.tool_call_parser if tools and forced is None else None
    return OpenAIPlan(r, True, seqs, [ids], f"chatcmpl-{rid}", int(time.time()), model, top_n, r.logprobs,
                      tool_parser=parser, messages=messages, forced_tool=forced)


def _schema_error(params: dict) -> str:
    from llguidance import LLMatcher

    return LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(params))


async def check_tool_schemas(service: RolloutService, r: ChatCompletionRequest, forced: str) -> None:
    """A forced call's parameter schemas must be ones the grammar library compiles: else a 400 naming the tool's
    field (the engine would only name "the grammar"). Checked off the event loop, bounded like any grammar
    (``engine.max_grammar_chars``, ``engine.grammar_compile_timeout_s``), for every engine kind."""
    tools = r.tool_schemas()
    engine = service.settings.engine
    limit = getattr(engine, "max_grammar_chars", 65536)
    timeout = getattr(engine, "grammar_compile_timeout_s", 10.0)
    for name in list(tools) if forced == "required" else [forced]:
        i, params = tools[name]
        field = f"tools[{i}].function.parameters"
        size = len(json.dumps(params))
        if size > limit:
            raise RequestError(f"{field}: {size} characters of JSON schema, more than engine.max_grammar_chars "
                               f"({limit})")
        try:
            error = await asyncio.wait_for(asyncio.to_thread(_schema_error, params), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise RequestError(f"{field}: checking the schema took more than {timeout:g}s") from None
        if error:
            raise RequestError(f"{field}: not a JSON schema a tool call can be constrained by: {error}")


def _forced_calls(p: OpenAIPlan, text: str) -> list[dict] | None:
    """The OpenAI ``tool_calls`` of a forced reply (its text is the JSON the grammar allowed), or None when the
    text is not complete JSON (the reply was cut at its length limit)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if p.forced_tool != "required":
        pairs = [(p.forced_tool, value)]
    elif isinstance(value, list) and all(isinstance(c, dict) and "name" in c for c in value):
        pairs = [(c["name"], c.get("parameters", {})) for c in value]
    else:
        return None
    return [ToolCall(name=str(name), arguments=args).openai() for name, args in pairs if isinstance(args, dict)] \
        or None


def assistant_message(p: OpenAIPlan, text: str, finish: str | None) -> tuple[AssistantMessage, str | None]:
    """The reply, with ``tool_calls`` read from the text when the request declared tools (finish_reason
    ``tool_calls`` then). A call the model wrote unreadably stays in the content, as vLLM's parsers leave it."""
    if p.forced_tool is not None:
        calls = _forced_calls(p, text)
        if calls is None:
            return AssistantMessage(content=text), finish
        return AssistantMessage(content=None, tool_calls=calls), "tool_calls" if finish == "stop" else finish
    if p.tool_parser is None:
        return AssistantMessage(content=text), finish
    parsed = parse_tool_calls(text, p.tool_parser)
    if not parsed.calls or parsed.errors:
        return AssistantMessage(content=text), finish
    calls = [c.openai() for c in parsed.calls]
    return AssistantMessage(content=parsed.content or None, tool_calls=calls), "tool_calls" if finish == "stop" else finish


# ---- pieces -------------------------------------------------------------------------------------------
def finish_reason(out_finish) -> tuple[str | None, str | int | None]:
    if out_finish is None:
        return None, None
    return out_finish.type, out_finish.matched if out_finish.type == "stop" else None


def _tok(service: RolloutService, p: OpenAIPlan, tid: int) -> str:
    return f"token_id:{tid}" if p.request.return_tokens_as_token_ids else service.token_text(tid)


def completion_logprobs(service: RolloutService, p: OpenAIPlan, ids, lps, tops, offset0: int) -> CompletionLogprobs:
    tokens = [_tok(service, p, t) for t in ids]
    offsets, pos = [], offset0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    if p.top_n and tops is not None:
        top = [{_tok(service, p, tid): lp for tid, lp in row} for row in tops]
    else:  # logprobs: 0 asks for no alternatives: the sampled token alone (vLLM's answer), never a missing field
        top = [{t: lp} for t, lp in zip(tokens, lps)]
    return CompletionLogprobs(tokens=tokens, token_logprobs=list(lps), top_logprobs=top, text_offset=offsets)


def chat_logprobs(service: RolloutService, p: OpenAIPlan, ids, lps, tops) -> ChoiceLogprobs:
    content = []
    for k, (tid, lp) in enumerate(zip(ids, lps)):
        tok = _tok(service, p, tid)
        alts = []
        if p.top_n and tops is not None and k < len(tops):
            for aid, alp in tops[k]:
                at = _tok(service, p, aid)
                alts.append(TopLogprob(token=at, logprob=alp, bytes=list(at.encode())))
        content.append(TokenLogprob(token=tok, logprob=lp, bytes=list(tok.encode()), top_logprobs=alts))
    return ChoiceLogprobs(content=content)


def _usage(p: OpenAIPlan, outs_tokens: int) -> Usage:
    prompt = sum(len(s.prompt_ids) for s in p.seqs)
    return Usage(prompt_tokens=prompt, completion_tokens=outs_tokens, total_tokens=prompt + outs_tokens)


def response(service: RolloutService, p: OpenAIPlan, outs: list[SequenceOutput]) -> dict:
    usage = _usage(p, sum(len(o.output_ids) for o in outs))
    n = p.request.n
    tids = p.request.return_token_ids
    version = str(max((o.weight_version for o in outs), default=0))
    meta = {"weight_version": version}  # where SGLang's OpenAI routes put it
    body: ChatCompletionResponse | CompletionResponse
    if p.chat:
        choices = []
        for k, o in enumerate(outs):
            fr, sr = finish_reason(o.finish)
            lp = chat_logprobs(service, p, o.output_ids, o.logprobs, o.top_logprobs) if p.want_logprobs else None
            message, fr = assistant_message(p, o.text, fr)
            choices.append(ChatChoice(index=k, message=message, logprobs=lp, finish_reason=fr,
                                      stop_reason=sr, token_ids=o.output_ids if tids else None))
        body = ChatCompletionResponse(id=p.id, created=p.created, model=p.model, choices=choices, usage=usage,
                                      prompt_token_ids=p.prompts[0] if tids else None, weight_version=version,
                                      metadata=meta)
    else:
        completions = []
        for k, o in enumerate(outs):
            fr, sr = finish_reason(o.finish)
            clp = (completion_logprobs(service, p, o.output_ids, o.logprobs, o.top_logprobs, 0)
                   if p.want_logprobs else None)
            completions.append(CompletionChoice(index=k, text=o.text, logprobs=clp, finish_reason=fr, stop_reason=sr,
                                            token_ids=o.output_ids if tids else None,
                                            prompt_token_ids=p.prompts[k // n] if tids else None))
        body = CompletionResponse(id=p.id, created=p.created, model=p.model, choices=completions, usage=usage,
                                  weight_version=version, metadata=meta)
    return body.model_dump(exclude_none=True)


#: called when choice ``k`` has streamed its last delta, before its last chunk is sent: ``(k, message)``, with
#: the assistant message as the client assembles it from the chunks (chat), else None
OnFinish = Callable[[int, "dict | None"], None]


async def sse_chunks(service: RolloutService, p: OpenAIPlan, deltas: AsyncIterator,
                     on_finish: OnFinish | None = None) -> AsyncIterator[bytes]:
    """OpenAI streaming: chunks per delta per choice, a usage chunk if asked, then ``[DONE]``.

    With tools declared, each choice's text goes through a :class:`ToolCallStream`: content streams until a
    call starts, each readable call is one ``delta.tool_calls`` chunk (whole arguments) once its text is
    complete, and the choice finishes with ``tool_calls`` (vLLM's shape)."""
    tids = p.request.return_token_ids
    opts = p.request.stream_options
    generated = 0
    text_pos = [0] * len(p.seqs)
    started = [False] * len(p.seqs)
    readers = [ToolCallStream(p.tool_parser) if p.tool_parser else None for _ in p.seqs]
    texts = [""] * len(p.seqs)
    if p.chat:
        for k in range(len(p.seqs)):
            first = ChatCompletionChunk(id=p.id, created=p.created, model=p.model,
                                        choices=[ChatChunkChoice(index=k, delta=DeltaMessage(role="assistant", content=""))],
                                        prompt_token_ids=p.prompts[0] if tids and k == 0 else None)
            yield _sse(first.model_dump(exclude_none=True))
    async for k, d in deltas:
        generated += len(d.token_ids)
        fr, sr = finish_reason(d.finish)
        if p.chat:
            chunks = _chat_chunks(service, p, k, d, readers[k], fr, sr)
            texts[k] += d.text
        else:
            lp = (completion_logprobs(service, p, d.token_ids, d.logprobs, d.top_logprobs, text_pos[k])
                  if p.want_logprobs else None)
            choice = CompletionChoice(index=k, text=d.text, logprobs=lp, finish_reason=fr, stop_reason=sr,
                                      token_ids=d.token_ids if tids else None,
                                      prompt_token_ids=p.prompts[k // p.request.n] if tids and not started[k] else None)
            chunks = [{"id": p.id, "object": "text_completion", "created": p.created, "model": p.model,
                       "choices": [choice.model_dump(exclude_none=True)]}]
        text_pos[k] += len(d.text)
        started[k] = True
        if d.finish is not None and on_finish is not None:
            on_finish(k, _streamed_message(readers[k], texts[k]) if p.chat else None)
        for chunk in chunks:
            if opts is not None and opts.include_usage and opts.continuous_usage_stats:
                chunk["usage"] = _usage(p, generated).model_dump()
            yield _sse(chunk)
    if opts is not None and opts.include_usage:
        obj = "chat.completion.chunk" if p.chat else "text_completion"
        yield _sse({"id": p.id, "object": obj, "created": p.created, "model": p.model, "choices": [],
                    "usage": _usage(p, generated).model_dump()})
    yield b"data: [DONE]\n\n"


def _chat_chunks(service: RolloutService, p: OpenAIPlan, k: int, d, reader: ToolCallStream | None,
                 fr: str | None, sr) -> list[dict]:
    """The chunks of one delta of chat choice ``k``: its content (and logprobs, token ids), then one chunk per
    tool call complete with it; the finish reason on the last."""
    tids = p.request.return_token_ids
    lp = chat_logprobs(service, p, d.token_ids, d.logprobs, d.top_logprobs) if p.want_logprobs else None
    if reader is None:
        content, calls = d.text, []
    else:
        piece = reader.feed(d.text)
        if d.finish is not None:
            end = reader.close()
            piece.content += end.content
            piece.calls += end.calls
            if reader.calls and fr == "stop":
                fr = "tool_calls"
        content, calls = piece.content or None, piece.calls
    choices = []
    if content is not None or lp is not None or tids or not calls:
        choices.append(ChatChunkChoice(index=k, delta=DeltaMessage(content=content), logprobs=lp,
                                       token_ids=d.token_ids if tids else None))
    first = len(reader.calls) - len(calls) if reader is not None else 0
    for i, call in enumerate(calls):
        entry = {"index": first + i, **call.openai()}
        choices.append(ChatChunkChoice(index=k, delta=DeltaMessage(tool_calls=[entry])))
    if d.finish is not None:
        choices[-1].finish_reason, choices[-1].stop_reason = fr, sr
    elif reader is not None and choices[0].delta.content is None and lp is None and not tids and not calls:
        return []  # held back (a possible call start, or a call's text): nothing to send yet
    return [ChatCompletionChunk(id=p.id, created=p.created, model=p.model, choices=[c]).model_dump(exclude_none=True)
            for c in choices]


def _streamed_message(reader: ToolCallStream | None, text: str) -> dict:
    """The assistant message a client assembles from a finished choice's chunks."""
    if reader is None:
        return AssistantMessage(content=text).model_dump(exclude_none=True)
    calls = [c.openai() for c in reader.calls]
    if not calls:
        return AssistantMessage(content=reader.content).model_dump(exclude_none=True)
    return AssistantMessage(content=reader.content or None, tool_calls=calls).model_dump(exclude_none=True)


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()
