"""An unhandled exception (a bug) becomes a JSON 500 in the envelope, and the connection lives on.

Starlette's ``ServerErrorMiddleware`` answers an unhandled exception with a 500 and then re-raises it, so
that servers can log it; uvicorn, seeing the exception after the response, closes the connection, and a
client's next request on that keep-alive connection fails (``ReadError``). :class:`InternalErrorGuard`
sits inside it (the app factory adds it as the innermost middleware), logs the traceback once, answers
the 500 and returns normally: the client gets a complete response and keeps its connection.

A response already started (a stream that failed halfway) cannot be completed honestly: then the
exception propagates and the server closes the connection, which tells the client the body is cut.

Pure ASGI, no FastAPI import.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from shared.service_kit.envelope import error_body

log = logging.getLogger("fleetrl.http")


def internal_error_message(exc: BaseException) -> str:
    """What the client is told: the kind of failure, never a traceback or internal state."""
    return f"internal error: {type(exc).__name__}"


class InternalErrorGuard:
    """ASGI middleware: an unhandled exception answers a 500 envelope without closing the connection."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_wrapper(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as exc:
            if started:
                raise
            log.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            body = json.dumps(error_body(500, internal_error_message(exc), "internal_error")).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
