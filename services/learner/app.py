"""The learner's FastAPI app, built with the service kit (``shared.service_kit.app``): the lifespan starts
and stops the LearnerService; every error is the kit's envelope."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from services.learner.routes import router
from services.learner.service import LearnerService
from services.learner.settings import LearnerSettings
from shared.service_kit.app import create_service_app


def create_app(settings: LearnerSettings, service: LearnerService | None = None,
               on_exit: Callable[[int], None] | None = None) -> FastAPI:
    """The app; ``service`` may be injected (tests), else built from ``settings``."""
    svc = service if service is not None else LearnerService(settings, on_exit=on_exit)
    return create_service_app(title="FleetRL learner", settings=settings, service=svc, routers=[router],
                              max_body_bytes=settings.max_body_bytes)
