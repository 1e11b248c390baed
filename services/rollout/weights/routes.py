"""The rollout service's weight routes and the sidecar's place in its lifespan.

Enable with ``extensions: ["services.rollout.weights.routes:weight_router"]`` in the rollout settings
(``FLEETRL_ROLLOUT_EXTENSIONS='["services.rollout.weights.routes:weight_router"]'``). The router's
lifespan starts the sidecar after the engine (it needs Redis: ``redis_url`` or ``$REDIS_URL``), and the
service serves only once the sidecar reached the latest version (bounded by ``join_timeout_s``).

Control routes (bearer token):

- ``GET /weights/version`` — this replica's ``weight_version``, the latest published one, its transport
  and the last update's outcome.
- ``POST /weights/update`` ``{"version": N | null, "timeout_s": 60}`` — bring this replica to version
  ``N`` (default: the latest) now and answer once it serves it (504 if it did not in time, 409 if ``N``
  was never published or is no longer the latest).
"""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from services.rollout.deps import ControlDep
from services.rollout.weights.settings import SidecarSettings
from shared.settings import load_settings
from shared.wire_checks import INT64_MAX, FiniteFloat, StrictInt

log = logging.getLogger(__name__)


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: StrictInt | None = Field(default=None, ge=1, le=INT64_MAX, description="Target version; default the latest published.")
    timeout_s: FiniteFloat = Field(default=60.0, gt=0, le=3600, description="How long to wait for the replica to load it.")


def get_sidecar(request: Request) -> Any:
    sidecar = getattr(request.app.state, "weight_sidecar", None)
    if sidecar is None:
        raise HTTPException(503, "weight sync is off in this replica (no redis_url / $REDIS_URL, or disabled)")
    return sidecar


SidecarDep = Annotated[Any, Depends(get_sidecar)]


def weight_router(service: Any, settings: SidecarSettings | None = None) -> APIRouter:
    """Extension factory: the weight routes plus a lifespan that runs the sidecar beside ``service``."""
    sidecar_settings = settings or load_settings(SidecarSettings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        redis_url = service.settings.redis_url or os.environ.get("REDIS_URL")
        if not sidecar_settings.enabled or not redis_url:
            log.warning("weight sidecar off (%s)", "disabled" if not sidecar_settings.enabled else "no redis_url")
            app.state.weight_sidecar = None
            yield
            return
        import redis.asyncio as aioredis

        from services.rollout.weights.sidecar import WeightSidecar

        redis = aioredis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=30)
        s = service.settings
        sidecar = WeightSidecar(service.engine, redis, s.run_name, sidecar_settings, name=f"{s.host}:{s.port}")
        await sidecar.start()
        app.state.weight_sidecar = sidecar
        try:
            yield
        finally:
            app.state.weight_sidecar = None
            await sidecar.stop()
            await redis.aclose()

    router = APIRouter(tags=["weights"], lifespan=lifespan)

    @router.get("/weights/version", dependencies=[ControlDep])
    async def weights_version(sidecar: SidecarDep) -> dict:
        return {**sidecar.status(), "latest_version": await sidecar.latest()}

    @router.post("/weights/update", dependencies=[ControlDep])
    async def update_weights(body: UpdateWeightsRequest, sidecar: SidecarDep) -> dict:
        latest = await sidecar.latest()
        target = body.version or latest
        if target == 0:
            raise HTTPException(409, "no weight version has been published yet")
        if target != latest:
            raise HTTPException(409, f"version {target} is not the latest published version ({latest}); "
                                     "only the latest can be loaded")
        if not await sidecar.ensure(target, body.timeout_s):
            raise HTTPException(504, f"replica still at version {sidecar.weight_version} after {body.timeout_s}s "
                                     f"(last error: {sidecar.last_error or 'none'})")
        return {"success": True, "weight_version": sidecar.weight_version}

    return router
