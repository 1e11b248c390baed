"""``GET /health`` (liveness), ``GET /health_generate`` (readiness), ``GET /model_info`` (also
``/get_model_info`` as SGLang names it), ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.rollout.deps import ServiceDep
from shared.generate_api import ModelInfo
from shared.telemetry import metrics_response

router = APIRouter(tags=["info"])


def _health_reply(service, ok: bool) -> JSONResponse:
    body = {"status": "ok" if ok else "unhealthy", "paused": service.engine.paused,
            "weight_version": str(service.engine.weight_version)}
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/health")
async def health(service: ServiceDep):
    """Liveness: answers at once however deep the queue (a busy engine is alive while it makes progress)."""
    return _health_reply(service, await service.health())


@router.get("/health_generate")
async def health_generate(service: ServiceDep):
    """Readiness: a real one-token generation through the queue, 503 if it does not finish in time."""
    return _health_reply(service, await service.health_generate())


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(service: ServiceDep) -> ModelInfo:
    s = service.settings
    return ModelInfo(model_path=s.model, tokenizer_path=s.model, weight_version=str(service.engine.weight_version),
                     engine=service.engine.kind, served_model_name=s.model_name,
                     context_length=service.engine.context_length, paused=service.engine.paused)


@router.get("/metrics")
async def metrics(service: ServiceDep):
    return metrics_response(service.metrics.registry)
