"""The rollout service's FastAPI app, built with the service kit (``shared.service_kit.app``).

Routers: generation (``/generate``, ``/v1/*``, ``/inference/v1/generate``), info, control, sessions (``/sessions/*``), the weight routes when the replica runs the
weight sidecar (``settings.sidecar_on``; the service object starts the sidecar itself), and extensions.

Extension seam: ``create_app(..., extra_routers=[...])``, or ``settings.extensions = ["pkg.module:factory"]``
where ``factory(service) -> APIRouter``. An extension router may carry its own ``lifespan`` (FastAPI merges
it into the app's), should protect control routes with ``services.rollout.deps.ControlDep``, and reaches the
engine through ``ServiceDep`` (``service.engine``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from services.rollout.errors import ENGINE_ERRORS
from services.rollout.metrics import RolloutMetrics
from services.rollout.routes import control, drain, generate, inference, info, openai, sessions
from services.rollout.service import RolloutService
from services.rollout.sessions.auth import KEY_PARAM, control_token_of, session_key
from services.rollout.sessions.registry import SessionElsewhere
from services.rollout.settings import RolloutSettings
from shared.service_kit.app import create_service_app
from shared.service_kit.body_limit import Observer
from shared.service_kit.errors import error_response
from shared.service_kit.loader import LoadError, load_object


@runtime_checkable
class RouterFactory(Protocol):
    """An extension: called once with the service object, returns the routes to add."""

    def __call__(self, service: Any, /) -> APIRouter: ...


def load_extension(path: str, service: RolloutService) -> APIRouter:
    router = load_object(path, RouterFactory, what="extension")(service)
    if not isinstance(router, APIRouter):
        raise LoadError(f"extension {path!r} returned {type(router).__name__}, not an APIRouter")
    return router


def request_metrics(metrics: RolloutMetrics) -> Observer:
    """The body-limit middleware's hook: request count and latency by route and status."""

    def observe(path: str, status: int, seconds: float) -> None:
        route = metrics.route_label(path)
        metrics.requests.labels(route, str(status)).inc()
        metrics.latency.labels(route).observe(seconds)

    return observe


def create_app(settings: RolloutSettings, *, service: RolloutService | None = None,
               extra_routers: Sequence[APIRouter] = ()) -> FastAPI:
    service = service or RolloutService(settings)
    routers = [generate.router, openai.router, inference.router, info.router, control.router, drain.router, sessions.control,
               sessions.scoped]
    if settings.sidecar_on:
        from services.rollout.routes.weights import router as weight_routes

        routers.append(weight_routes)
    routers += extra_routers
    routers += [load_extension(p, service) for p in settings.extensions]
    app = create_service_app(
        title="FleetRL rollout", settings=settings, service=service, routers=routers,
        max_body_bytes=settings.limits.max_body_bytes, body_limit_setting="limits.max_body_bytes",
        retry_after_s=settings.limits.retry_after_s, translate=ENGINE_ERRORS, observe=request_metrics(service.metrics),
    )
    app.add_exception_handler(SessionElsewhere, _session_elsewhere)
    return app


async def _session_elsewhere(request: Request, exc: Exception) -> JSONResponse:
    """A session call for a session another replica holds: 307 to the same path and query there (307 keeps the
    method and the body; the OpenAI client follows it)."""
    assert isinstance(exc, SessionElsewhere)
    # the caller was authorised here (recording.session_named); clients drop Authorization on a redirect to another
    # host, so the owner gets the session's key in the query instead
    token = control_token_of(request)
    query = [(k, v) for k, v in request.query_params.multi_items() if k != KEY_PARAM]
    if token:
        query.append((KEY_PARAM, session_key(token, exc.session_id)))
    location = exc.owner + request.url.path + (f"?{urlencode(query)}" if query else "")
    return error_response(exc.status, exc.message, exc.type, {**exc.headers, "Location": location})
