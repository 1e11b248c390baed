"""Errors the rollout service maps to HTTP statuses, and the handlers that do it (one shape everywhere).

Bodies are ``{"error": {"message", "type", "code"}, "detail": message}``: the OpenAI client reads
``error.message``; FastAPI-style clients read ``detail``. User input never produces a 500; a bug does, in
the same shape, from :class:`shared.http_errors.InternalErrorGuard` (the app installs it with
:func:`internal_error_body`), which keeps the client's connection open.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.rollout.engines.base import EnginePaused, EngineUnavailable, SequenceRejected
from shared.wire_checks import printable


class RequestError(ValueError):
    """The request is well-formed JSON but asks for something impossible (400 by default)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Overloaded(RuntimeError):
    """More sequences than ``limits.max_inflight_sequences``: 429 with Retry-After."""


def _body(status: int, message: str, kind: str) -> dict:
    message = printable(message)  # may quote the bad input, e.g. an unknown field named "\ud800"
    return {"error": {"message": message, "type": kind, "code": status}, "detail": message}


def internal_error_body(status: int, message: str) -> dict:
    """The body of a 500 (``InternalErrorGuard``'s render)."""
    return _body(status, message, "internal_error")


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(_body(status, message, kind), status_code=status, headers=headers)


def validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        if err.get("type") == "extra_forbidden":
            parts.append(f"{where}: unknown field (not part of this API)")
        elif err.get("type") == "json_invalid":
            parts.append(f"body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}")
        elif err.get("type") == "string_unicode":  # a lone surrogate where pydantic needs a str (a field name)
            parts.append(f"{where}: holds text that is not valid UTF-8 (a lone surrogate, perhaps in a field name)")
        elif err.get("type") == "missing" and where == "body":
            parts.append("body: a JSON object is required")
        else:
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            parts.append(f"{where}: {msg}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI, retry_after_s: int) -> None:
    retry = {"Retry-After": str(retry_after_s)}

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, validation_message(exc), "invalid_request_error")

    @app.exception_handler(RequestError)
    async def _request(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, str(exc), "invalid_request_error")

    @app.exception_handler(SequenceRejected)
    async def _rejected(_: Request, exc: SequenceRejected) -> JSONResponse:
        return error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(Overloaded)
    async def _overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return error_response(429, str(exc), "overloaded", retry)

    @app.exception_handler(EnginePaused)
    async def _paused(_: Request, exc: EnginePaused) -> JSONResponse:
        return error_response(503, str(exc), "paused", retry)

    @app.exception_handler(EngineUnavailable)
    async def _unavailable(_: Request, exc: EngineUnavailable) -> JSONResponse:
        return error_response(503, str(exc), "engine_unavailable", retry)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), "http_error", getattr(exc, "headers", None))
