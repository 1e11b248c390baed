"""Failures of scorers and of requests, each carrying the HTTP status it maps to."""

from __future__ import annotations

from shared.service_kit.errors import ServiceError


class ScorerFailure(Exception):
    """A scorer call failed. ``status`` is the HTTP status the request gets if this is final."""

    status = 502
    retryable = True
    tries = 1  # how many tries the service made before giving up (set by the service)

    def __init__(self, message: str, *, retryable: bool | None = None, cause: str | None = None):
        super().__init__(message)
        self.message = message
        #: the failure itself, as ``/health``'s ``failing`` and a stalled run quote it (a refusal by the
        #: circuit breaker gives the last real failure behind it)
        self.cause = cause or message
        if retryable is not None:
            self.retryable = retryable


class ScorerTimeout(ScorerFailure):
    """The scorer (or the remote service behind it) did not answer in time."""

    status = 504


class ScorerUnavailable(ScorerFailure):
    """The scorer cannot be reached (connection refused, ...)."""

    status = 503


class CircuitOpen(ScorerUnavailable):
    """Recent calls kept failing; calls are refused until the breaker's reset time passes."""

    retryable = False


class InvalidItem(Exception):
    """An item cannot be scored as sent (e.g. a verifier needs a label): the client's fault, a 422."""

    status = 422


_TYPES = {413: "request_too_large", 422: "invalid_request_error", 502: "scorer_error", 503: "scorer_unavailable",
          504: "scorer_timeout"}


class RewardRequestError(ServiceError):
    """A request failed because of one or more scorers (policy ``fail``) or bad items; ``errors`` holds one
    ``{"scorer", "error"}`` record per cause (the envelope's ``errors``)."""

    def __init__(self, status: int, detail: str, errors: list[dict] | None = None):
        super().__init__(detail, status=status, type=_TYPES.get(status, "scorer_error"), errors=errors or None)
        self.detail = detail
