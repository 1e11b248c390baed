"""Thin routes of the Tinker API (``/api/v1/...``, as the ``tinker`` client calls them): one call on the
TinkerService each. Mutating calls answer ``{request_id, model_id}``; ``retrieve_future`` gives the result."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse

from services.learner.tinker import api
from services.learner.tinker.deps import ApiKeyDep, ServiceDep
from services.learner.tinker.errors import NotServed
from services.learner.tinker.service import run_blocking
from services.learner.tinker.wire import decode_forward_backward, decompress

PROTO = "application/x-protobuf"
open_router = APIRouter()
router = APIRouter(prefix="/api/v1", dependencies=[ApiKeyDep])
unserved_router = APIRouter(prefix="/api/v1", dependencies=[ApiKeyDep])  # included last: after every served route


@open_router.get("/health")
@open_router.get("/api/v1/healthz")
async def health() -> dict:
    return {"status": "ok"}


@open_router.get("/status")
async def status(svc: ServiceDep) -> dict:
    return svc.status()


@router.post("/client/config")
async def client_config(svc: ServiceDep) -> dict:
    return svc.client_config()


@router.post("/create_session")
async def create_session(body: api.CreateSession, svc: ServiceDep) -> dict:
    return {"type": "create_session", "session_id": svc.create_session()}


@router.post("/session_heartbeat")
async def session_heartbeat(body: api.SessionRef, svc: ServiceDep) -> dict:
    svc.heartbeat(body.session_id)
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: Annotated[str, Path(max_length=200)], body: api.FinishSession, svc: ServiceDep) -> dict:
    svc.finish_session(session_id, body.reason.type, body.detail)
    return {"type": "finish_session"}


@router.post("/telemetry")
async def telemetry() -> dict:
    return {"status": "accepted"}


@router.get("/get_server_capabilities")
async def capabilities(svc: ServiceDep) -> dict:
    return await run_blocking(svc.capabilities)


@router.post("/create_model")
async def create_model(body: api.CreateModel, svc: ServiceDep) -> dict:
    request_id, model_id = svc.create_model(body)
    return {"request_id": request_id, "model_id": model_id}


@router.post("/get_info")
async def get_info(body: api.ModelRef, svc: ServiceDep) -> dict:
    return svc.get_info(body.model_id)


@router.post("/forward_backward")
async def forward_backward(request: Request, svc: ServiceDep) -> dict:
    raw = await request.body()
    call = await run_blocking(lambda: decode_forward_backward(decompress(raw, request.headers.get("content-encoding"))))
    return {"request_id": svc.forward_backward(call), "model_id": call.model_id}


@router.post("/optim_step")
async def optim_step(body: api.OptimStep, svc: ServiceDep) -> dict:
    return {"request_id": svc.optim_step(body), "model_id": body.model_id}


@router.post("/save_weights")
async def save_weights(body: api.SaveWeights, svc: ServiceDep) -> dict:
    return {"request_id": svc.save_state(body), "model_id": body.model_id}


@router.post("/load_weights")
async def load_weights(body: api.LoadWeights, svc: ServiceDep) -> dict:
    request_id, model_id = svc.load_state(body)
    return {"request_id": request_id, "model_id": model_id}


@router.post("/weights_info")
async def weights_info(body: api.WeightsInfo, svc: ServiceDep) -> dict:
    return await run_blocking(svc.weights_info, body.tinker_path)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(body: api.SaveWeights, svc: ServiceDep) -> dict:
    return {"request_id": svc.save_for_sampler(body), "model_id": body.model_id}


@router.post("/create_sampling_session")
async def create_sampling_session(body: api.CreateSamplingSession, svc: ServiceDep) -> dict:
    return {"type": "create_sampling_session", "sampling_session_id": svc.create_sampling_session(body)}


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, svc: ServiceDep) -> dict:
    return svc.get_sampler(sampler_id)


@router.post("/asample")
async def asample(body: api.Sample, svc: ServiceDep) -> dict:
    request_id, sequence_ids = svc.sample(body)
    return {"request_id": request_id, "sample_sequence_ids": sequence_ids}


@router.post("/retrieve_future")
async def retrieve_future(body: api.RetrieveFuture, svc: ServiceDep) -> Response:
    entry = await svc.retrieve(body.request_id)
    if entry is None:
        return JSONResponse({"type": "try_again", "request_id": body.request_id, "queue_state": "active"})
    if entry.error is not None:
        return JSONResponse({"error": entry.error, "category": entry.category})
    if isinstance(entry.result, bytes):
        return Response(entry.result, media_type=PROTO)
    return JSONResponse(entry.result)


@router.post("/client/dynamic_config")
async def client_dynamic_config(svc: ServiceDep) -> dict:
    return svc.dynamic_config()


@router.post("/cancel_future")
async def cancel_future(body: api.RequestRef, svc: ServiceDep) -> dict:
    svc.cancel(body.request_id)
    return {"type": "cancel_future", "request_id": body.request_id}


@router.post("/unload_model")
async def unload_model(body: api.ModelRef, svc: ServiceDep) -> dict:
    svc.unload_model(body.model_id)
    return {"type": "unload_model", "model_id": body.model_id}


@router.post("/join_sampling_session")
async def join_sampling_session(body: api.SamplingSessionRef, svc: ServiceDep) -> dict:
    return {"type": "join_sampling_session", "client_counter": svc.join_sampling_session(body.sampling_session_id)}


@router.post("/retrieve_futures")
async def retrieve_futures(body: api.RetrieveFutures, svc: ServiceDep) -> dict:
    return await svc.retrieve_futures(body)


UNSERVED = {
    "create_custom_loss": "custom losses are not run on this server (client config custom_loss_server_side is "
                          "false): use forward_backward_custom, which runs the loss on the client",
    "auth/token": "this server takes the API key itself (client config pjwt_auth_enabled is false): no JWT exchange",
    "copy_weights": "copy_weights is not served; save_state then create_training_client_from_state copies a model",
    "save_weights_external": "external weight storage is not served; save_state / save_weights_for_sampler keep "
                             "checkpoints under the server's run_dir",
}


@unserved_router.api_route("/{route:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def unserved(route: str, request: Request) -> Response:
    """Every other ``/api/v1`` route: a 400 that says so (the client does not retry a 400, as it does a 5xx)."""
    reason = UNSERVED.get(route.strip("/"), "this route of the Tinker API is not served by FleetRL (docs/tinker.md "
                                            "lists what is)")
    raise NotServed(f"{request.method} /api/v1/{route}: {reason}")
