"""The bearer-token check of control routes (pause, weight update, checkpoint, stop), in every service.

The token is the service settings' ``control_token`` (``app.state.settings``). Without one, the control
plane is off: every control route answers 403. With one, a request without ``Authorization: Bearer
<token>``, or with another token, gets 401 (``WWW-Authenticate: Bearer``). The comparison takes constant
time. The OpenAPI spec declares the scheme (``HTTPBearer``) on every route that depends on the check.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shared.service_kit.errors import ServiceError

CONTROL_SCHEME = "control_token"
"""The security scheme's name in the OpenAPI spec (the kit's spec declares 401 / 403 where it appears)."""
_bearer = HTTPBearer(auto_error=False, scheme_name=CONTROL_SCHEME,
                     description="The service's control_token (control routes only).")


class ControlOff(ServiceError):
    """No control_token is configured: the control plane is off."""

    status = 403
    type = "forbidden"


class NotAuthorized(ServiceError):
    """No bearer token, or a wrong one."""

    status = 401
    type = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


def check_control_token(expected: str | None, authorization: str | None) -> None:
    """Raise :class:`ControlOff` / :class:`NotAuthorized` unless ``authorization`` carries ``expected``."""
    if not expected:
        raise ControlOff("control routes are off: no control_token is configured")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise NotAuthorized("control route: send Authorization: Bearer <control_token>")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise NotAuthorized("control route: wrong bearer token")


def require_control(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """FastAPI dependency of control routes (``ControlDep``); ``_`` only declares the scheme in the spec."""
    token = getattr(request.app.state.settings, "control_token", None)
    check_control_token(token.get_secret_value() if token is not None else None,
                        request.headers.get("authorization"))
