"""FastAPI app factory of the learner: the lifespan starts and stops the LearnerService."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from shared.auth import control_guard
from shared.http_errors import InternalErrorGuard

from .routes import router
from .service import ControlError, LearnerService
from .settings import LearnerSettings


def create_app(settings: LearnerSettings, service: LearnerService | None = None,
               on_exit: Callable[[int], None] | None = None) -> FastAPI:
    """The app; ``service`` may be injected (tests), else built from ``settings``."""
    svc = service if service is not None else LearnerService(settings, on_exit=on_exit)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await svc.start()
        try:
            yield
        finally:
            await svc.close()

    app = FastAPI(title="FleetRL learner", lifespan=lifespan)
    app.state.learner_service = svc
    app.state.control_guard = control_guard(settings.control_token)
    app.include_router(router)
    app.add_middleware(InternalErrorGuard)  # a bug answers a JSON 500 and keeps the client's connection

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(ControlError)
    async def _control(request: Request, exc: ControlError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    return app
