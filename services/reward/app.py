"""The reward service's FastAPI app, built with the service kit (``shared.service_kit.app``): the
lifespan starts and stops the RewardService; every error is the kit's envelope."""

from __future__ import annotations

from fastapi import FastAPI

from services.reward.metrics import RewardMetrics
from services.reward.routes import router
from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.service_kit.app import create_service_app
from shared.service_kit.body_limit import Observer

SCORING_ROUTES = ("/score", "/get_reward")


def request_metrics(metrics: RewardMetrics) -> Observer:
    """The body-limit middleware's hook: scoring requests by route and status (errors and 413s included)."""

    def observe(path: str, status: int, seconds: float) -> None:
        if path in SCORING_ROUTES:
            metrics.requests.labels(path, str(status)).inc()

    return observe


def create_app(settings: RewardSettings, service: RewardService | None = None) -> FastAPI:
    """The app; ``service`` may be injected (tests), else it is built from ``settings``."""
    svc = service if service is not None else RewardService(settings)
    return create_service_app(title="FleetRL reward service", settings=settings, service=svc, routers=[router],
                              max_body_bytes=settings.max_body_bytes, observe=request_metrics(svc.metrics))
