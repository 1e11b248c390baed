"""The Tinker mode's errors (the service kit's envelope, with the status each one means)."""

from __future__ import annotations

from shared.service_kit.errors import ServiceError


class BadRequest(ServiceError):
    """A request the server cannot serve as sent: 400 (or the status given), with what is wrong."""

    status = 400
    type = "invalid_request_error"


class NotFound(ServiceError):
    status = 404
    type = "not_found"


class Gone(ServiceError):
    """A future that is unknown or expired: the client resubmits (410)."""

    status = 410
    type = "gone"


class Full(ServiceError):
    status = 409
    type = "conflict"


class Unauthorized(ServiceError):
    status = 401
    type = "unauthorized"


class NotServed(ServiceError):
    """A Tinker API route this server does not serve: 400, saying what to use instead."""

    status = 400
    type = "not_served"
