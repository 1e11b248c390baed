"""The Tinker mode's FastAPI app, built with the service kit: the lifespan starts and stops the TinkerService."""

from __future__ import annotations

from fastapi import FastAPI

from services.learner.tinker.routes import open_router, router, unserved_router
from services.learner.tinker.service import TinkerService
from services.learner.tinker.settings import TinkerSettings
from shared.service_kit.app import create_service_app


def create_app(settings: TinkerSettings, service: TinkerService | None = None) -> FastAPI:
    svc = service if service is not None else TinkerService(settings)
    return create_service_app(title="FleetRL Tinker API", settings=settings, service=svc,
                              routers=[open_router, router, unserved_router], max_body_bytes=settings.max_body_bytes,
                              description="The Tinker API (tinker client 0.38) served by FleetRL's learner.")
