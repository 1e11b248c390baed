"""The rollout service's FastAPI app factory.

Extension seam (weight-sync routes and anything else): ``create_app(..., extra_routers=[...])``, or
``settings.extensions = ["pkg.module:factory"]`` where ``factory(service) -> APIRouter``. An extension
router may carry its own ``lifespan`` (FastAPI merges it into the app's), and should protect control
routes with ``services.rollout.deps.ControlDep``; it reaches the engine through ``ServiceDep``
(``service.engine``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from services.rollout.errors import install_error_handlers, internal_error_body
from services.rollout.middleware import RequestGuard
from services.rollout.routes import control, generate, info, openai
from services.rollout.service import RolloutService
from services.rollout.settings import RolloutSettings
from shared.http_errors import InternalErrorGuard


def load_extension(path: str, service: RolloutService) -> APIRouter:
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"extension {path!r}: use 'package.module:factory'")
    factory = getattr(importlib.import_module(module), attr)
    router = factory(service)
    if not isinstance(router, APIRouter):
        raise TypeError(f"extension {path!r} returned {type(router).__name__}, not an APIRouter")
    return router


def create_app(settings: RolloutSettings, *, service: RolloutService | None = None,
               extra_routers: Sequence[APIRouter] = ()) -> FastAPI:
    service = service or RolloutService(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title="FleetRL rollout", lifespan=lifespan)
    app.state.service = service
    app.state.settings = settings
    install_error_handlers(app, settings.limits.retry_after_s)
    app.add_middleware(InternalErrorGuard, render=internal_error_body)  # innermost: a bug's 500 keeps the connection
    app.add_middleware(RequestGuard, max_bytes=settings.limits.max_body_bytes, metrics=service.metrics)
    routers = [generate.router, openai.router, info.router, control.router, *extra_routers]
    routers += [load_extension(p, service) for p in settings.all_extensions]
    for router in routers:
        app.include_router(router)
    return app
