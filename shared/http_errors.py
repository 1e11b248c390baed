"""An unhandled exception (a bug) becomes a JSON 500 in the service's error shape, and the connection lives on.

Starlette's ``ServerErrorMiddleware`` answers an unhandled exception with a 500 and then re-raises it, so
that servers can log it; uvicorn, seeing the exception after the response, closes the connection, and a
client's next request on that keep-alive connection fails (``ReadError``). :class:`InternalErrorGuard`
sits inside it (add it as the innermost ``app.add_middleware``), logs the traceback once, answers the 500
and returns normally: the client gets a complete response and keeps its connection.

A response already started (a stream that failed halfway) cannot be completed honestly: then the
exception propagates and the server closes the connection, which tells the client the body is cut.

Used by the rollout, reward and learner apps; pure ASGI, no FastAPI import.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fleetrl.http")

Render = Callable[[int, str], dict[str, Any]]


def detail_body(status: int, message: str) -> dict[str, Any]:
    """FastAPI's default error shape: ``{"detail": message}``."""
    return {"detail": message}


def internal_error_message(exc: BaseException) -> str:
    """What the client is told: the kind of failure, never a traceback or internal state."""
    return f"internal error: {type(exc).__name__}"


class InternalErrorGuard:
    """ASGI middleware: unhandled exceptions answer ``render(500, message)`` as JSON without closing the connection."""

    def __init__(self, app: Any, render: Render = detail_body) -> None:
        self.app = app
        self.render = render

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
            body = json.dumps(self.render(500, internal_error_message(exc))).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
