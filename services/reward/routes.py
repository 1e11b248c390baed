"""Thin routes: typed request in, one call on the RewardService, typed reply out. The routes that score or
describe the configuration need the auth_token when one is set (``TokenDep``); /health and /metrics do not."""

from __future__ import annotations

from fastapi import APIRouter, Response

from services.reward.deps import TOKEN_ERRORS, ServiceDep, TokenDep
from shared.reward_api import (
    GetRewardRequest,
    GetRewardResponse,
    RewardHealth,
    ScoreRequest,
    ScoreResponse,
    ScorersResponse,
)
from shared.service_kit.openapi import error_responses
from shared.telemetry import PrometheusText, metrics_response

router = APIRouter()

# 413: more items than max_items; 422: an item a scorer cannot score as sent (a verifier without a label);
# 502 / 503 / 504: a scorer whose policy is `fail` failed, could not be reached, or timed out.
SCORING_ERRORS = {**error_responses(422, 502, 503, 504), **TOKEN_ERRORS}


@router.post("/score", dependencies=[TokenDep], response_model=ScoreResponse, responses=SCORING_ERRORS)
async def score(body: ScoreRequest, svc: ServiceDep) -> ScoreResponse:
    svc.metrics.request_items.labels("/score").observe(len(body.items))
    return await svc.score(body.items)


@router.post("/get_reward", dependencies=[TokenDep], response_model=GetRewardResponse, responses=SCORING_ERRORS)
async def get_reward(body: GetRewardRequest, svc: ServiceDep) -> GetRewardResponse:
    svc.metrics.request_items.labels("/get_reward").observe(len(body.query))
    return await svc.get_reward(body)


@router.get("/scorers", dependencies=[TokenDep], response_model=ScorersResponse, responses=TOKEN_ERRORS)
async def scorers(svc: ServiceDep) -> ScorersResponse:
    return ScorersResponse(scorers=svc.describe())


@router.get("/health", response_model=RewardHealth,
            responses={503: {"model": RewardHealth, "description": "A scorer's check failed (the same body)."}})
async def health(svc: ServiceDep, response: Response) -> RewardHealth:
    checks = await svc.health()
    ok = all(v == "ok" for v in checks.values())
    response.status_code = 200 if ok else 503
    return RewardHealth(status="ok" if ok else "unhealthy", scorers=checks, failing=svc.failing())


@router.get("/metrics", response_class=PrometheusText)
async def metrics(svc: ServiceDep) -> PrometheusText:
    """Prometheus text exposition."""
    return metrics_response(svc.metrics.registry)
