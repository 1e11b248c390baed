"""Helpers shared by the generation routes: SSE responses, client-disconnect handling, what their spec declares."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from services.rollout.errors import RequestError
from shared.service_kit.envelope import error_body
from shared.service_kit.openapi import Responses, error_responses

log = logging.getLogger(__name__)
T = TypeVar("T")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

SSE_EVENT = {  # one server-sent event (OpenAPI 3.1: a text/event-stream `schema` describes each event)
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "A chunk as JSON; if generation fails after the first "
                                                              "chunk, the error envelope; `[DONE]` last."}},
}
SSE_OK: Responses = {200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                "description": "The result; with `stream`, server-sent events."}}
GENERATION_ERRORS = error_responses(429, 503)  # 429: over capacity; 503: paused past its wait, engine down


class SSEResponse(StreamingResponse):
    """A stream whose generation is closed (its sequences aborted if still running) and whose ``cleanup`` runs
    once the response is over, however it ended: finished, failed, or the client gone before or while the
    body streamed (Starlette then stops iterating the body without closing it)."""

    def __init__(self, body: AsyncGenerator[bytes, None], deltas: AsyncGenerator,
                 cleanup: Callable[[], None] | None) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._body = body  # body_iterator, typed as the generator it is
        self._deltas = deltas
        self._cleanup = cleanup

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._body.aclose()
                await self._deltas.aclose()
            finally:
                if self._cleanup is not None:
                    self._cleanup()


async def sse_response(deltas: AsyncGenerator, render: Callable[[AsyncIterator], AsyncIterator[bytes]],
                       cleanup: Callable[[], None] | None = None) -> StreamingResponse:
    """Stream ``render(deltas)``. The first delta is awaited here, so admission failures (429 / 503)
    still get a real status; later failures become an SSE error event before ``[DONE]``. A client that
    disconnects cancels the stream, which aborts its sequences. ``cleanup`` runs once the stream is over
    (or here, if it never starts)."""
    try:
        first = await deltas.__anext__()
    except BaseException:
        try:
            await deltas.aclose()
        finally:
            if cleanup is not None:
                cleanup()
        raise

    async def chained() -> AsyncIterator:
        yield first
        async for item in deltas:
            yield item

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in render(chained()):
                yield chunk
        except Exception as exc:  # noqa: BLE001 - headers are sent: report it in-band, never a torn stream
            log.warning("stream failed: %r", exc)
            err = error_body(500, f"generation failed: {exc}", type(exc).__name__)
            yield f"data: {json.dumps(err)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            await deltas.aclose()

    return SSEResponse(body(), deltas, cleanup)


async def until_disconnect(request: Request, work: Awaitable[T], poll_s: float = 0.25) -> T:
    """Run ``work``; cancel it (aborting its sequences, freeing their slots) if the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise RequestError("client disconnected", status=499)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
