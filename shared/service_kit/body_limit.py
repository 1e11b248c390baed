"""ASGI middleware of every service: request bodies over a limit get 413 before anyone parses them.

By ``Content-Length`` up front (the answer closes the connection: the unread body stays behind), or, for a
chunked body, while the app reads it (the app never buffers more than the limit). POST / PUT / PATCH bodies
are read as JSON whatever their content type says: every body here is JSON, and ``curl -d`` (form-encoded)
or no content type would otherwise fail with a confusing form-parsing error (SGLang and vLLM do the same).

``observe(path, status, seconds)``, when given, is called once per request after it ended (a stream: after
its last byte): the place for a service's own request metrics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.service_kit.envelope import error_body

Observer = Callable[[str, int, float], None]
_BODY_METHODS = ("POST", "PUT", "PATCH")


def _json_content_type(scope: Scope) -> Scope:
    headers = scope.get("headers") or []
    if b"json" in dict(headers).get(b"content-type", b""):
        return scope
    kept = [(k, v) for k, v in headers if k != b"content-type"]
    return {**scope, "headers": [*kept, (b"content-type", b"application/json")]}


class BodyLimitMiddleware:
    """413 for bodies over ``max_bytes`` (``setting`` names the setting in the message); see the module."""

    def __init__(self, app: ASGIApp, max_bytes: int, setting: str = "max_body_bytes",
                 observe: Observer | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.setting = setting
        self.observe = observe

    def _message(self, size: str) -> str:
        return f"request body of {size} bytes is over the limit of {self.max_bytes} bytes ({self.setting})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if scope.get("method") in _BODY_METHODS:
            scope = _json_content_type(scope)
        try:
            declared = dict(scope.get("headers") or []).get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                await self._too_large(send_wrapper, declared.decode())
                return
            received = 0

            async def receive_wrapper() -> Message:
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > self.max_bytes:  # an HTTPException: FastAPI's body reading lets it through
                        raise HTTPException(413, self._message(f"at least {received}"))
                return message

            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            if self.observe is not None:
                self.observe(scope.get("path", ""), status, time.monotonic() - started)

    async def _too_large(self, send: Send, size: str) -> None:
        body = json.dumps(error_body(413, self._message(size), "request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
