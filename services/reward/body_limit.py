"""ASGI middleware: request bodies larger than a limit get 413 before anyone parses them."""

from __future__ import annotations

import json


class BodyLimitMiddleware:
    """Rejects by Content-Length when given; otherwise counts streamed bytes and stops at the limit."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send, size: str) -> None:
        body = json.dumps({"detail": f"request body of {size} bytes is over the limit of {self.max_bytes} bytes "
                                     "(max_body_bytes); split the batch"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send, length.decode())
        if length is not None:
            return await self.app(scope, receive, send)
        # No Content-Length (chunked): read up to the limit, then replay the body to the app.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return await self._reject(send, f"more than {size}")
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)
