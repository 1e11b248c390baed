"""The rollout service's weight routes (control plane, bearer token).

- ``GET /weights/version`` — this replica's ``weight_version``, the latest published one, its transport
  and the last update's outcome.
- ``POST /weights/update`` ``{"version": N | null, "timeout_s": 60}`` — bring this replica to version
  ``N`` (default: the latest) now and answer once it serves it (504 if it did not in time, 409 if ``N``
  was never published or is no longer the latest).

They reach the replica's sidecar through the rollout service object (``service.weight_sidecar``, built by
:func:`services.rollout.weights.sidecar.create_sidecar` and started by the service object); 503 while the
replica runs none. The rollout app includes :data:`router` when the sidecar is on (``weight_sidecar``, by
default with the worker).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from services.rollout.deps import ControlDep
from services.rollout.weights.sidecar import WeightSidecar
from services.rollout.weights.transport import LastUpdate
from shared.service_kit.errors import ServiceError
from shared.service_kit.openapi import error_responses
from shared.weight_sync.wire import Transport
from shared.wire_checks import INT64_MAX, FiniteFloat, StrictInt


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: StrictInt | None = Field(default=None, ge=1, le=INT64_MAX, description="Target version; default the latest published.")
    timeout_s: FiniteFloat = Field(default=60.0, gt=0, le=3600, description="How long to wait for the replica to load it.")


class WeightsStatus(BaseModel):
    """``GET /weights/version``: where this replica stands."""

    replica_id: str = Field(description="This replica's id in the weight-sync registry.")
    weight_version: int = Field(description="The version the engine serves.")
    latest_version: int = Field(description="The latest version the learner published (0: none yet).")
    transport: Transport = Field(description="How versions reach this replica.")
    backend: Literal["gloo", "nccl"] = Field(description="Collective backend the replica joins.")
    updating: bool = Field(description="An update is running now.")
    last_update: LastUpdate | None = Field(description="The last update this replica ran (None: none yet).")
    first_update: LastUpdate | None = Field(default=None, description="The first version it loaded: how it joined "
                                            "(source peer: from another replica, docs/elastic.md).")
    last_error: str = Field(description="Why the last update did not load ('' when it did).")


class UpdateWeightsResponse(BaseModel):
    """``POST /weights/update``: the replica serves the version asked for."""

    success: Literal[True] = True
    weight_version: int = Field(description="The version the engine serves now.")


class WeightSyncOff(ServiceError):
    """This replica runs no weight sidecar: 503."""

    status = 503
    type = "weight_sync_off"


class VersionConflict(ServiceError):
    """The version asked for cannot be loaded (never published, or no longer the latest): 409."""

    status = 409
    type = "version_conflict"


class BucketNotFound(ServiceError):
    """The version has no such bucket: 404."""

    status = 404
    type = "bucket_not_found"


class UpdateTimeout(ServiceError):
    """The replica did not reach the version in the time asked for: 504."""

    status = 504
    type = "update_timeout"


def get_sidecar(request: Request) -> WeightSidecar:
    sidecar = getattr(request.app.state.service, "weight_sidecar", None)
    if sidecar is None:
        raise WeightSyncOff("weight sync is off in this replica (weights.enabled is false, or no redis_url)")
    return sidecar


SidecarDep = Annotated[WeightSidecar, Depends(get_sidecar)]

router = APIRouter(tags=["weights"])


@router.get("/weights/version", dependencies=[ControlDep], response_model=WeightsStatus,
            responses=error_responses(503))  # 503: no sidecar here
async def weights_version(sidecar: SidecarDep) -> WeightsStatus:
    return WeightsStatus(**sidecar.status(), latest_version=await sidecar.latest())


@router.get("/weights/peer/{version}/{bucket}", dependencies=[ControlDep], response_class=Response,
            responses={**error_responses(404, 409, 503),
                       200: {"content": {"application/octet-stream": {}}, "description": "The bucket's raw bytes."}})
async def peer_bucket(sidecar: SidecarDep, version: Annotated[int, Path(ge=1, le=INT64_MAX)],
                      bucket: Annotated[int, Path(ge=0, le=1_000_000)]) -> Response:
    """Bucket ``bucket`` of ``version`` as this replica's engine holds it (raw bytes in the learner's layout), for
    a replica joining the pool (services/rollout/weights/peer.py); it checks them against the learner's digests.
    409 unless this replica holds exactly ``version``."""
    try:
        data = await sidecar.peer_bucket(version, bucket)
    except LookupError as exc:
        raise BucketNotFound(str(exc)) from None
    except ValueError as exc:
        raise VersionConflict(str(exc)) from None
    except RuntimeError as exc:
        raise WeightSyncOff(str(exc)) from None
    return Response(content=data, media_type="application/octet-stream", headers={"X-Weight-Version": str(version)})


@router.post("/weights/update", dependencies=[ControlDep], response_model=UpdateWeightsResponse,
             responses=error_responses(409, 503, 504))  # 409: not the latest version; 504: not reached in time
async def update_weights(body: UpdateWeightsRequest, sidecar: SidecarDep) -> UpdateWeightsResponse:
    latest = await sidecar.latest()
    target = body.version or latest
    if target == 0:
        raise VersionConflict("no weight version has been published yet")
    if target != latest:
        raise VersionConflict(f"version {target} is not the latest published version ({latest}); "
                              "only the latest can be loaded")
    if not await sidecar.ensure(target, body.timeout_s):
        raise UpdateTimeout(f"replica still at version {sidecar.weight_version} after {body.timeout_s}s "
                            f"(last error: {sidecar.last_error or 'none'})")
    return UpdateWeightsResponse(weight_version=sidecar.weight_version)
