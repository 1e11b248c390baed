"""What each service's ``deps.py`` builds its ``Annotated`` aliases from.

    ServiceDep = Annotated[RolloutService, Depends(get_service)]   # services/rollout/deps.py
    ControlDep                                                     # dependencies=[ControlDep]

The app factory puts the one service object on ``app.state.service`` (and the settings on
``app.state.settings``); tests swap the service through ``app.dependency_overrides[get_service]``.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request

from shared.service_kit.auth import require_control


def get_service(request: Request) -> Any:
    """The app's one service object."""
    return request.app.state.service


ControlDep = Depends(require_control)
"""Bearer-token check of control routes: ``dependencies=[ControlDep]`` (401 / 403, see :mod:`.auth`)."""
