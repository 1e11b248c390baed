"""``POST /drain`` (bearer token): this replica leaves the pool without losing work, then exits.

It takes no more prompts, lets the groups it holds finish (up to ``timeout_s``, default
``worker.drain_timeout_s``), hands the rest back at once, and exits; on the way out the weight sidecar
deregisters. SIGTERM does the same (the service's shutdown drains first). ``GET /drain`` says where it is.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from services.rollout.deps import ControlDep, ServiceDep
from shared.service_kit.openapi import error_responses
from shared.wire_checks import FiniteFloat

router = APIRouter(tags=["control"], dependencies=[ControlDep])


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: FiniteFloat | None = Field(default=None, ge=0, le=3600,
                                          description="Time the groups in progress get to finish before the rest are "
                                                      "handed back; default worker.drain_timeout_s.")


class DrainState(BaseModel):
    draining: bool = Field(description="A drain was asked for (the replica takes no more prompts).")
    done: bool = Field(description="Drained: the replica is exiting.")
    held: int | None = Field(default=None, description="Groups it held when the drain began.")
    finished: int | None = Field(default=None, description="Of those, finished and pushed.")
    handed_back: int | None = Field(default=None, description="Prompts handed back for another replica to take.")
    seconds: float | None = None


@router.post("/drain", response_model=DrainState, status_code=202, responses=error_responses(401))
async def drain(service: ServiceDep, body: DrainRequest | None = None) -> DrainState:
    service.drain((body or DrainRequest()).timeout_s)
    return DrainState(**service.drain_state())


@router.get("/drain", response_model=DrainState, responses=error_responses(401))
async def drain_state(service: ServiceDep) -> DrainState:
    return DrainState(**service.drain_state())
