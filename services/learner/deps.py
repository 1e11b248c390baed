"""FastAPI dependencies of the learner as ``Annotated`` aliases (tests can override ``get_service``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from shared.service_kit.deps import ControlDep, get_service

from .service import LearnerService

ServiceDep = Annotated[LearnerService, Depends(get_service)]

__all__ = ["ControlDep", "ServiceDep", "get_service"]
