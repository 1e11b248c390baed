"""Thin routes: one call on the LearnerService each."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from shared.telemetry import metrics_response

from .service import LearnerService


def get_service(request: Request) -> LearnerService:
    return request.app.state.learner_service


def require_control(request: Request) -> None:
    request.app.state.control_guard(request)


ServiceDep = Annotated[LearnerService, Depends(get_service)]
Control = Depends(require_control)

router = APIRouter()


@router.get("/health")
async def health(svc: ServiceDep) -> JSONResponse:
    ok, checks = await svc.health()
    return JSONResponse({"status": "ok" if ok else "unhealthy", **checks}, status_code=200 if ok else 503)


@router.get("/status")
async def status(svc: ServiceDep) -> dict:
    return svc.status()


@router.get("/metrics")
async def metrics(svc: ServiceDep) -> Response:
    return metrics_response(svc.registry)


@router.post("/checkpoint", dependencies=[Control])
async def checkpoint(svc: ServiceDep) -> dict:
    return await svc.checkpoint()


@router.post("/stop", dependencies=[Control], status_code=202)
async def stop(svc: ServiceDep) -> dict:
    return svc.request_stop()
