"""Dependencies of the Tinker routes: the service object and the X-API-Key check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from services.learner.tinker.errors import Unauthorized
from services.learner.tinker.service import TinkerService
from shared.service_kit.deps import get_service

ServiceDep = Annotated[TinkerService, Depends(get_service)]


def require_api_key(request: Request) -> None:
    """401 unless the request carries the server's api_key as ``X-API-Key`` (constant-time comparison)."""
    expected = request.app.state.settings.api_key.get_secret_value()
    given = request.headers.get("x-api-key") or ""
    if not given:
        raise Unauthorized("send the server's api_key as X-API-Key (TINKER_API_KEY)")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise Unauthorized("wrong X-API-Key")


ApiKeyDep = Depends(require_api_key)
