"""Control plane (bearer token): ``/pause_generation``, ``/continue_generation``.

The weight routes (``routes/weights.py``) use the same ``ControlDep``.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from services.rollout.deps import ControlDep, ServiceDep
from services.rollout.errors import RequestError
from shared.generate_api import ControlReply
from shared.service_kit.openapi import error_responses
from shared.wire_checks import FiniteFloat

router = APIRouter(tags=["control"], dependencies=[ControlDep])


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["abort", "wait"] = Field(default="abort", description="abort: end in-flight sequences; wait: let them finish.")
    timeout_s: FiniteFloat | None = Field(default=None, gt=0, le=86400,
                                          description="wait mode: give up waiting after this long.")


@router.post("/pause_generation", response_model=ControlReply, responses=error_responses(503, 504))
async def pause_generation(service: ServiceDep, body: PauseRequest | None = None) -> ControlReply:
    body = body or PauseRequest()
    try:
        await service.pause(body.mode, body.timeout_s)
    except asyncio.TimeoutError:
        raise RequestError(f"paused, but sequences were still running after {body.timeout_s}s", status=504) from None
    return ControlReply(success=True, message=f"generation paused ({body.mode})")


@router.post("/continue_generation", response_model=ControlReply, responses=error_responses(503))
async def continue_generation(service: ServiceDep) -> ControlReply:
    await service.resume()
    return ControlReply(success=True, message="generation continued")
