"""The one error envelope of every FleetRL service (pydantic models: the OpenAPI specs declare them too).

Every 4xx/5xx body, on every route of every service::

    {"error": {"message": "...", "type": "invalid_request_error", "code": 400}, "detail": "..."}

``error`` is OpenAI's shape (the ``openai`` client reads ``error.message``), ``detail`` FastAPI's (what
FastAPI-style clients read); both carry the same message. ``errors`` is added when a request failed for
several reasons that each have their own record (the reward service: one per failing scorer).

No FastAPI import: the pure-ASGI middleware render it too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.wire_checks import printable


class ErrorInfo(BaseModel):
    """What went wrong (OpenAI's ``error`` object)."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(description="What went wrong and, where it can, how to fix it.")
    type: str = Field(description="Kind of error: invalid_request_error, overloaded, paused, unauthorized, ...")
    code: int = Field(description="The HTTP status, repeated.")


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body of every FleetRL service."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorInfo
    detail: str = Field(description="The same message as error.message (FastAPI clients read this one).")
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="One record per cause when several things failed (reward: one per scorer).")


def error_body(status: int, message: str, kind: str, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The envelope as a JSON-ready dict (``message`` may quote bad input: unpaired surrogates are escaped)."""
    message = printable(message)
    body: dict[str, Any] = {"error": {"message": message, "type": kind, "code": status}, "detail": message}
    if errors:
        body["errors"] = errors
    return body
