"""ASGI middleware: request-body size limit (413) and per-route request metrics."""

from __future__ import annotations

import json
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.rollout.metrics import RolloutMetrics


def _json_content_type(scope: Scope) -> Scope:
    """Every POST body here is JSON: treat ``curl -d`` (form-urlencoded) or no content type as JSON,
    as SGLang and vLLM do, instead of failing with a confusing form-parsing error."""
    headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
    ctype = dict(scope.get("headers") or []).get(b"content-type", b"")
    if b"json" in ctype:
        return scope
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


class RequestGuard:
    """Reads every POST body as JSON, refuses bodies over ``max_bytes`` with 413 (by Content-Length up front, or while reading a chunked
    body) and records request count / latency by route and status."""

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: RolloutMetrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        route = self.metrics.route_label(scope.get("path", ""))
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        if scope.get("method") == "POST":
            scope = _json_content_type(scope)
        try:
            declared = dict(scope.get("headers") or []).get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                await self._too_large(send_wrapper, int(declared))
                return
            received = 0

            async def receive_wrapper() -> Message:
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > self.max_bytes:
                        raise HTTPException(413, f"request body over {self.max_bytes} bytes")
                return message

            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            self.metrics.requests.labels(route, str(status[0])).inc()
            self.metrics.latency.labels(route).observe(time.monotonic() - started)

    async def _too_large(self, send: Send, size: int) -> None:
        msg = f"request body of {size} bytes is over the limit of {self.max_bytes} bytes"
        body = json.dumps({"error": {"message": msg, "type": "request_too_large", "code": 413}, "detail": msg}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
