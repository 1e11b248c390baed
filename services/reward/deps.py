"""FastAPI dependencies of the reward service as ``Annotated`` aliases (tests can override ``get_service``).

``TokenDep`` is the bearer check of the routes that score (they cost compute, and money where a scorer is a
paid remote model) or describe the configuration: with ``auth_token`` set, a request without ``Authorization:
Bearer <auth_token>``, or with another token, gets 401 (the kit's ``NotAuthorized``, constant-time compare);
unset, there is no check. ``/health`` and ``/metrics`` never need it.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.reward.service import RewardService
from shared.service_kit.auth import NotAuthorized
from shared.service_kit.deps import get_service
from shared.service_kit.envelope import ErrorResponse
from shared.service_kit.openapi import Responses

ServiceDep = Annotated[RewardService, Depends(get_service)]

_bearer = HTTPBearer(auto_error=False, scheme_name="auth_token",
                     description="The reward service's auth_token (when it is set).")


def require_token(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """401 unless ``Authorization: Bearer <auth_token>`` (no check without an auth_token)."""
    token = request.app.state.settings.auth_token
    if token is None:
        return
    scheme, _sep, given = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise NotAuthorized("this route needs Authorization: Bearer <auth_token> (the reward service's auth_token)")
    if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise NotAuthorized("wrong bearer token (not the reward service's auth_token)")


TokenDep = Depends(require_token)
TOKEN_ERRORS: Responses = {401: {"model": ErrorResponse, "description": "auth_token is set: no bearer token, or a wrong one."}}

__all__ = ["TOKEN_ERRORS", "ServiceDep", "TokenDep", "get_service"]
