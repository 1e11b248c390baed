"""FastAPI app factory of the reward service: lifespan owns the RewardService; errors become clear 4xx/5xx."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from services.reward.body_limit import BodyLimitMiddleware
from services.reward.errors import RewardRequestError
from services.reward.routes import router
from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.http_errors import InternalErrorGuard
from shared.wire_checks import printable


def _readable(exc: RequestValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        out.append(printable(f"{loc}: {err.get('msg', 'invalid')}"))  # the loc may be a bad key itself
    return out


def create_app(settings: RewardSettings, service: RewardService | None = None) -> FastAPI:
    """The app; ``service`` may be injected (tests), else it is built from ``settings``."""
    svc = service if service is not None else RewardService(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await svc.start()
        try:
            yield
        finally:
            await svc.close()

    app = FastAPI(title="FleetRL reward service", lifespan=lifespan)
    app.state.reward_service = svc
    app.include_router(router)
    app.add_middleware(InternalErrorGuard)  # a bug answers a JSON 500 and keeps the client's connection
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        svc.metrics.requests.labels(request.url.path, "422").inc()
        return JSONResponse({"detail": _readable(exc)}, status_code=422)

    @app.exception_handler(RewardRequestError)
    async def _failed(request: Request, exc: RewardRequestError) -> JSONResponse:
        svc.metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return JSONResponse({"detail": exc.detail, "errors": exc.errors}, status_code=exc.status)

    return app
