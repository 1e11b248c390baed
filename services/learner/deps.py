"""FastAPI dependencies of the learner as ``Annotated`` aliases (tests can override ``get_service``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from services.learner.service import LearnerService
from shared.service_kit.deps import ControlDep, get_service

ServiceDep = Annotated[LearnerService, Depends(get_service)]

__all__ = ["ControlDep", "ServiceDep", "get_service"]
