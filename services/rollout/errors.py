"""The rollout service's errors and the HTTP status each maps to (in the kit's one envelope).

Bodies are ``{"error": {"message", "type", "code"}, "detail": message}`` (:mod:`shared.service_kit.envelope`):
the OpenAI client reads ``error.message``; FastAPI-style clients read ``detail``. User input never produces
a 500; a bug does, in the same shape, and keeps the client's connection open.
"""

from __future__ import annotations

from services.rollout.engines.base import EnginePaused, EngineUnavailable, SequenceRejected
from shared.service_kit.errors import ErrorKind, ServiceError


class RequestError(ServiceError, ValueError):
    """The request is well-formed JSON but asks for something impossible (400 unless ``status`` says)."""

    status = 400
    type = "invalid_request_error"


class Overloaded(ServiceError, RuntimeError):
    """More sequences than ``limits.max_inflight_sequences``: 429 with Retry-After."""

    status = 429
    type = "overloaded"
    retry_after = True


ENGINE_ERRORS: dict[type[Exception], ErrorKind] = {
    SequenceRejected: ErrorKind(400, "invalid_request_error"),
    EnginePaused: ErrorKind(503, "paused", retry_after=True),
    EngineUnavailable: ErrorKind(503, "engine_unavailable", retry_after=True),
}
"""The engines' exceptions (which know nothing of HTTP), as the rollout service answers them."""
