"""FastAPI dependencies as ``Annotated`` aliases (tests can override ``get_service``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.rollout.service import RolloutService
from shared.auth import control_guard


def get_service(request: Request) -> RolloutService:
    return request.app.state.service


def require_control(request: Request) -> None:
    """Bearer-token check for control routes (403 when no token is configured). Weight routes use it too."""
    control_guard(request.app.state.settings.control_token)(request)


ServiceDep = Annotated[RolloutService, Depends(get_service)]
ControlDep = Depends(require_control)
