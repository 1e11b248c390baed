"""``GET /health`` (liveness), ``GET /health_generate`` (readiness), ``GET /model_info`` (also
``/get_model_info`` as SGLang names it), ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Response

from services.rollout.deps import ServiceDep
from services.rollout.service import RolloutService
from shared.generate_api import ModelInfo, RolloutHealth
from shared.service_kit.openapi import Responses
from shared.telemetry import PrometheusText, metrics_response

router = APIRouter(tags=["info"])

UNHEALTHY: Responses = {503: {"model": RolloutHealth, "description": "Unhealthy (the same body, status unhealthy)."}}


def _health(service: RolloutService, ok: bool, response: Response) -> RolloutHealth:
    response.status_code = 200 if ok else 503
    return RolloutHealth(status="ok" if ok else "unhealthy", paused=service.engine.paused,
                         weight_version=str(service.engine.weight_version))


@router.get("/health", response_model=RolloutHealth, responses=UNHEALTHY)
async def health(service: ServiceDep, response: Response) -> RolloutHealth:
    """Liveness: answers at once however deep the queue (a busy engine is alive while it makes progress)."""
    return _health(service, await service.health(), response)


@router.get("/health_generate", response_model=RolloutHealth, responses=UNHEALTHY)
async def health_generate(service: ServiceDep, response: Response) -> RolloutHealth:
    """Readiness: a real one-token generation through the queue, 503 if it does not finish in time."""
    return _health(service, await service.health_generate(), response)


@router.get("/model_info", response_model=ModelInfo)
@router.get("/get_model_info", response_model=ModelInfo)
async def model_info(service: ServiceDep) -> ModelInfo:
    s = service.settings
    return ModelInfo(model_path=s.model, tokenizer_path=s.model, weight_version=str(service.engine.weight_version),
                     engine=service.engine.kind, served_model_name=s.model_name,
                     context_length=service.engine.context_length, paused=service.engine.paused)


@router.get("/metrics", response_class=PrometheusText)
async def metrics(service: ServiceDep) -> PrometheusText:
    """Prometheus text exposition."""
    return metrics_response(service.metrics.registry)
