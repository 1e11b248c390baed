"""The base class of every service's errors, and the handlers that answer them (and request-validation
errors, and Starlette's own) with the envelope (:mod:`.envelope`).

A service's own errors subclass :class:`ServiceError` (status, type, headers); exceptions from code that
knows nothing of HTTP (an engine's) are mapped once, by the service, through ``install_error_handlers``'s
``translate``. Request-validation errors are 400 everywhere, with one message (:mod:`.validation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.service_kit.envelope import error_body
from shared.service_kit.validation import validation_message


def error_response(status: int, message: str, kind: str, headers: Mapping[str, str] | None = None,
                   errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, kind, errors), status_code=status,
                        headers=dict(headers) if headers else None)


class ServiceError(Exception):
    """Base of every service's own errors: carries the HTTP status, the envelope's ``type`` and headers.

    Subclasses set the class attributes; ``retry_after`` adds ``Retry-After`` (the app's ``retry_after_s``).
    """

    status: int = 400
    type: str = "invalid_request_error"
    retry_after: bool = False

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None,
                 headers: Mapping[str, str] | None = None, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.headers = dict(headers or {})
        self.errors = errors


class ErrorKind(NamedTuple):
    """How an exception from code that knows nothing of HTTP is answered."""

    status: int
    type: str
    retry_after: bool = False


# Starlette's own HTTPExceptions (404, 405, a body found too large while reading it) by status.
_HTTP_TYPES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
               413: "request_too_large"}


def install_error_handlers(app: FastAPI, *, retry_after_s: int | None = None,
                           translate: Mapping[type[Exception], ErrorKind] | None = None) -> None:
    """Answer validation errors (400), :class:`ServiceError` s, ``translate`` d exceptions and Starlette's
    HTTPExceptions with the envelope."""
    retry = {"Retry-After": str(retry_after_s)} if retry_after_s else {}

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, validation_message(exc), "invalid_request_error")

    @app.exception_handler(ServiceError)
    async def _service(_: Request, exc: ServiceError) -> JSONResponse:
        headers = {**(retry if exc.retry_after else {}), **exc.headers}
        return error_response(exc.status, exc.message, exc.type, headers, exc.errors)

    for cls, kind in (translate or {}).items():
        async def handler(_: Request, exc: Exception, kind: ErrorKind = kind) -> JSONResponse:
            return error_response(kind.status, str(exc), kind.type, retry if kind.retry_after else None)

        app.add_exception_handler(cls, handler)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), _HTTP_TYPES.get(exc.status_code, "http_error"),
                              getattr(exc, "headers", None))
