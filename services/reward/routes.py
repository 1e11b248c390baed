"""Thin routes: typed request in, one call on the RewardService, typed reply out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from services.reward.service import RewardService
from shared.reward_api import GetRewardRequest, GetRewardResponse, ScoreRequest, ScoreResponse
from shared.telemetry import metrics_response


def get_service(request: Request) -> RewardService:
    return request.app.state.reward_service


ServiceDep = Annotated[RewardService, Depends(get_service)]

router = APIRouter()


@router.post("/score", response_model=ScoreResponse)
async def score(body: ScoreRequest, svc: ServiceDep) -> ScoreResponse:
    svc.metrics.request_items.labels("/score").observe(len(body.items))
    reply = await svc.score(body.items)
    svc.metrics.requests.labels("/score", "200").inc()
    return reply


@router.post("/get_reward", response_model=GetRewardResponse)
async def get_reward(body: GetRewardRequest, svc: ServiceDep) -> GetRewardResponse:
    svc.metrics.request_items.labels("/get_reward").observe(len(body.query))
    reply = await svc.get_reward(body)
    svc.metrics.requests.labels("/get_reward", "200").inc()
    return reply


@router.get("/scorers")
async def scorers(svc: ServiceDep) -> dict:
    return {"scorers": svc.describe()}


@router.get("/health")
async def health(svc: ServiceDep) -> JSONResponse:
    checks = await svc.health()
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ok else "unhealthy", "scorers": checks}, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(svc: ServiceDep) -> Response:
    return metrics_response(svc.metrics.registry)
