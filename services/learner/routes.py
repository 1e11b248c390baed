"""Thin routes: one call on the LearnerService each, typed replies."""

from __future__ import annotations

from fastapi import APIRouter, Response

from services.learner.deps import ControlDep, ServiceDep
from shared.learner_api import CheckpointResponse, LearnerHealth, LearnerStatus, StopResponse
from shared.service_kit.openapi import error_responses
from shared.telemetry import PrometheusText, metrics_response

router = APIRouter()


@router.get("/health", response_model=LearnerHealth, response_model_exclude_none=True,
            responses={503: {"model": LearnerHealth, "description": "The run failed or Redis is unreachable."}})
async def health(svc: ServiceDep, response: Response) -> LearnerHealth:
    ok, checks = await svc.health()
    response.status_code = 200 if ok else 503
    return LearnerHealth(status="ok" if ok else "unhealthy", **checks)


@router.get("/status", response_model=LearnerStatus, response_model_exclude_unset=True)
async def status(svc: ServiceDep) -> LearnerStatus:
    return LearnerStatus.model_validate(svc.status())


@router.get("/metrics", response_class=PrometheusText)
async def metrics(svc: ServiceDep) -> PrometheusText:
    """Prometheus text exposition."""
    return metrics_response(svc.registry)


@router.post("/checkpoint", dependencies=[ControlDep], response_model=CheckpointResponse,
             responses=error_responses(409, 504))  # 409: the run is not running; 504: no step boundary in time
async def checkpoint(svc: ServiceDep) -> CheckpointResponse:
    return CheckpointResponse.model_validate(await svc.checkpoint())


@router.post("/stop", dependencies=[ControlDep], status_code=202, response_model=StopResponse)
async def stop(svc: ServiceDep) -> StopResponse:
    return StopResponse.model_validate(svc.request_stop())
