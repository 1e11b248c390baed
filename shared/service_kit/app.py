"""``create_service_app``: every FleetRL service's FastAPI app, built the same way.

A service is a settings class, a service object and its routers::

    app = create_service_app(title="FleetRL reward", settings=settings, service=RewardService(settings),
                             routers=[router], max_body_bytes=settings.max_body_bytes)

- the one service object lives on ``app.state.service`` (the settings on ``app.state.settings``); the
  lifespan awaits its ``start()`` before the first request and its ``stop()`` after the last;
- every error is the envelope (:mod:`.errors`), validation errors are 400;
- middleware, outermost first: the body limit (413, and ``observe`` for the service's request metrics),
  then the internal-error guard (a bug's 500 keeps the client's connection);
- the OpenAPI spec declares every status the kit answers (:mod:`.openapi`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol, runtime_checkable

from fastapi import APIRouter, FastAPI

from shared.service_kit.body_limit import BodyLimitMiddleware, Observer
from shared.service_kit.errors import ErrorKind, install_error_handlers
from shared.service_kit.internal_errors import InternalErrorGuard
from shared.service_kit.openapi import install_openapi


@runtime_checkable
class ServiceObject(Protocol):
    """The one object a service's app owns: started before the first request, stopped after the last."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def create_service_app(*, title: str, settings: Any, service: ServiceObject, routers: Sequence[APIRouter],
                       max_body_bytes: int, body_limit_setting: str = "max_body_bytes",
                       retry_after_s: int | None = None,
                       translate: Mapping[type[Exception], ErrorKind] | None = None,
                       observe: Observer | None = None, description: str = "") -> FastAPI:
    """The app of one service; see the module. ``translate`` maps exceptions of code that knows nothing of
    HTTP to statuses; ``retry_after_s`` is sent as Retry-After with the errors that ask for it."""
    if not isinstance(service, ServiceObject):
        raise TypeError(f"{type(service).__name__} is not a service object: it needs async start() and stop()")

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(title=title, description=description, lifespan=lifespan)
    app.state.service = service
    app.state.settings = settings
    install_error_handlers(app, retry_after_s=retry_after_s, translate=translate)
    app.add_middleware(InternalErrorGuard)  # innermost: a bug's 500 keeps the connection
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes, setting=body_limit_setting, observe=observe)
    for router in routers:
        app.include_router(router)
    install_openapi(app)
    return app
