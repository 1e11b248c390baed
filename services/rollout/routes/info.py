"""``GET /health``, ``GET /model_info`` (also ``/get_model_info`` as SGLang names it), ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.rollout.deps import ServiceDep
from shared.generate_api import ModelInfo
from shared.telemetry import metrics_response

router = APIRouter(tags=["info"])


@router.get("/health")
async def health(service: ServiceDep):
    ok = await service.health()
    body = {"status": "ok" if ok else "unhealthy", "paused": service.engine.paused,
            "weight_version": str(service.engine.weight_version)}
    return JSONResponse(body, status_code=200 if ok else 503)


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
