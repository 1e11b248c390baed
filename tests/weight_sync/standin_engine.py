"""A stand-in for an SGLang or vLLM server's weight endpoints (not their generation): it runs the
receiving side of the broadcast itself, the way those servers do, and keeps what arrived so that a test
can check the bytes. Run: ``python -m tests.weight_sync.standin_engine PORT [VLLM_RELEASE] [SGLANG_RELEASE]``.

The vLLM routes are those of the release named (read from the 0.17.0 and 0.33.0 wheels):

- ``0.33.0`` (the default): ``/pause``, ``/resume``, ``/init_weight_transfer_engine`` (the packed-transfer
  parameters ``packed``, ``packed_buffer_size_bytes``, ``packed_num_buffers`` in the init info), an update
  session ``/start_weight_update`` -> ``/update_weights`` (names, dtype_names, shapes only) ->
  ``/finish_weight_update {weight_version}``, ``/weight_info``, ``/shutdown_weight_transfer_engine``. A second
  start while a session is open and an update or finish outside one are errors, as in vLLM's worker.
- ``0.17.0``: ``/pause``, ``/resume``, ``/init_weight_transfer_engine`` (rendezvous fields only),
  ``/update_weights`` (the packed parameters with each update); no session routes (404).

Both reject a field their info dataclass lacks. ``SGLANG_RELEASE`` (default ``0.5.23``) is what
``/server_info`` (0.5.23) or ``/get_server_info`` (older) report.

The group is formed exactly as SGLang's ``init_custom_process_group`` does (tcp rendezvous,
``PrefixStore(group_name)``, ``_new_process_group_helper``) - written out here, not imported from FleetRL.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
import zlib

import torch
import torch.distributed as dist
import uvicorn
from fastapi import FastAPI
from torch.distributed import distributed_c10d as c10d

torch.set_num_threads(1)
app = FastAPI()
state: dict = {"groups": {}, "weights": {}, "calls": [], "weight_version": None, "paused": False}
VLLM = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else "0.33.0"
SGLANG = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else "0.5.23"
WIRE = ("packed", "packed_buffer_size_bytes", "packed_num_buffers")
WIRE_AT_INIT = VLLM != "0.17.0"


def _error(message: str, status: int = 500):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": {"message": message, "code": status}})


def _strict(cls_name: str, info: dict, allowed: tuple[str, ...]):
    """What vLLM answers when its info dataclass gets a field it does not have: the worker's TypeError comes back
    through the engine core as a bare ``Exception``, which 0.17 answers with Starlette's plain 500 (no reason)
    and 0.33's catch-all handler as JSON with the message."""
    from fastapi.responses import PlainTextResponse

    extra = [k for k in info if k not in allowed]
    if not extra:
        return None
    if VLLM == "0.17.0":
        return PlainTextResponse("Internal Server Error", status_code=500)
    return _error(f"Invalid info for {cls_name}: __init__() got an unexpected keyword argument '{extra[0]}'")


def _form(master_address, master_port, rank, world_size, group_name, backend):
    timeout = datetime.timedelta(seconds=30)
    store, _, _ = next(c10d.rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(world_size, rank, [], c10d.Backend(backend), store,
                                           group_name=group_name, timeout=timeout)
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def _receive_flat(names, dtypes, shapes, pg):
    tensors = [torch.empty(s, dtype=getattr(torch, d)) for d, s in zip(dtypes, shapes)]
    flat = torch.empty(sum(t.numel() * t.element_size() for t in tensors), dtype=torch.uint8)
    dist.broadcast(flat, src=0, group=pg)
    off = 0
    for name, t in zip(names, tensors):
        n = t.numel() * t.element_size()
        t.view(-1).view(torch.uint8).copy_(flat[off:off + n])
        state["weights"][name] = t
        off += n


def _ok(name: str, body: dict) -> dict:
    state["calls"].append({"path": name, "body": body})
    return {"success": True, "message": "ok"}


# ---- SGLang ------------------------------------------------------------------------------------------
@app.post("/init_weights_update_group")
async def init_group(body: dict):
    pg = await asyncio.to_thread(_form, body["master_address"], body["master_port"], body["rank_offset"],
                                 body["world_size"], body["group_name"], body["backend"])
    state["groups"][body["group_name"]] = pg
    return _ok("/init_weights_update_group", body)


@app.post("/update_weights_from_distributed")
async def update_distributed(body: dict):
    assert body["load_format"] == "flattened_bucket"
    pg = state["groups"][body["group_name"]]
    await asyncio.to_thread(_receive_flat, body["names"], body["dtypes"], body["shapes"], pg)
    if body.get("weight_version") is not None:
        state["weight_version"] = body["weight_version"]
    return _ok("/update_weights_from_distributed", {k: v for k, v in body.items() if k not in ("names", "shapes")})


@app.post("/destroy_weights_update_group")
async def destroy_group(body: dict):
    pg = state["groups"].pop(body["group_name"], None)
    if pg is None:
        return {"success": False, "message": "no such group"}
    dist.destroy_process_group(pg)
    return _ok("/destroy_weights_update_group", body)


def _server_info() -> dict:
    return {"version": SGLANG, "tp_size": 1}


if SGLANG.startswith("0.5.23"):
    app.get("/server_info")(_server_info)
app.get("/get_server_info")(_server_info)  # deprecated in 0.5.23, served before


# ---- vLLM --------------------------------------------------------------------------------------------
@app.post("/init_weight_transfer_engine")
async def init_engine(body: dict):
    info = body["init_info"]
    base = ("master_address", "master_port", "rank_offset", "world_size")
    bad = _strict("NCCLWeightTransferInitInfo", info, base + (WIRE if WIRE_AT_INIT else ()))
    if bad is not None:
        return bad
    if WIRE_AT_INIT:
        state["wire"] = {k: info[k] for k in WIRE}
    old = state["groups"].pop("vllm", None)
    if old is not None:  # vLLM replaces its engine's group (the new one may reuse the old one's port, so name)
        dist.destroy_process_group(old)
    pg = await asyncio.to_thread(_form, info["master_address"], info["master_port"], info["rank_offset"],
                                 info["world_size"], f"fleetrl-weights-{info['master_port']}", "gloo")
    state["groups"]["vllm"] = pg
    return _ok("/init_weight_transfer_engine", body)


@app.get("/version")
async def version():
    return {"version": VLLM}


@app.post("/pause")
async def pause(mode: str = "abort", clear_cache: bool = True):
    if mode not in ("abort", "wait", "keep"):
        return _error(f"Invalid pause mode: {mode}", 400)
    state["paused"] = True
    state["calls"].append({"path": f"/pause?mode={mode}", "body": {}})
    return {"status": "paused"}


@app.post("/resume")
async def resume():
    state["paused"] = False
    state["calls"].append({"path": "/resume", "body": {}})
    return {"status": "resumed"}


@app.get("/is_paused")
async def is_paused():
    return {"is_paused": state["paused"]}


async def start_update(body: dict | None = None):
    if state.get("session"):
        return _error("start_weight_update called while a weight update is already active. "
                      "Call finish_weight_update first.")
    state["session"] = True
    return _ok("/start_weight_update", body or {})


async def finish_update(body: dict | None = None):
    if not state.get("session"):
        return _error("finish_weight_update called without a matching start_weight_update.")
    state["session"] = False
    if (body or {}).get("weight_version") is not None:
        state["weight_version"] = body["weight_version"]
    return _ok("/finish_weight_update", body or {})


async def weight_info():
    return {"weight_version": state["weight_version"] or "0"}


async def shutdown_engine(body: dict | None = None):
    old = state["groups"].pop("vllm", None)
    if old is not None:
        dist.destroy_process_group(old)
    return _ok("/shutdown_weight_transfer_engine", body or {})


if VLLM != "0.17.0":  # the update session and the version routes came after 0.17
    app.post("/start_weight_update")(start_update)
    app.post("/finish_weight_update")(finish_update)
    app.get("/weight_info")(weight_info)
    app.post("/shutdown_weight_transfer_engine")(shutdown_engine)


@app.post("/update_weights")
async def update_weights(body: dict):
    info = body["update_info"]
    base = ("names", "dtype_names", "shapes")
    if VLLM == "0.17.0":
        base += ("is_checkpoint_format",)
    bad = _strict("NCCLWeightTransferUpdateInfo", info, base + (() if WIRE_AT_INIT else WIRE))
    if bad is not None:
        return bad
    if VLLM != "0.17.0" and not state.get("session"):
        return _error("start_weight_update must be called before update_weights.")
    if not state["paused"]:
        state["unpaused_updates"] = state.get("unpaused_updates", 0) + 1
    wire = state["wire"] if WIRE_AT_INIT else info
    assert wire["packed"] is True
    limit = wire["packed_buffer_size_bytes"]
    chunk: list[tuple] = []
    size = 0

    def flush() -> None:
        nonlocal chunk, size
        names, dtypes, shapes = zip(*chunk)
        _receive_flat(list(names), list(dtypes), list(shapes), state["groups"]["vllm"])
        chunk, size = [], 0

    def receive_all() -> None:  # vLLM's packed consumer rule: a buffer closes once it passes the limit
        nonlocal size
        for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"]):
            chunk.append((name, dtype, shape))
            numel = 1
            for d in shape:
                numel *= d
            size += numel * getattr(torch, dtype).itemsize
            if size > limit:
                flush()
        if chunk:
            flush()

    await asyncio.to_thread(receive_all)
    return _ok("/update_weights", {"n": len(info["names"])})


# ---- for the test ------------------------------------------------------------------------------------
@app.get("/standin/state")
async def dump():
    sums = {n: zlib.crc32(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))
            for n, t in state["weights"].items()}
    return {"crc": sums, "calls": [c["path"] for c in state["calls"]], "weight_version": state["weight_version"],
            "groups": list(state["groups"]), "paused": state["paused"],
            "unpaused_updates": state.get("unpaused_updates", 0)}


@app.get("/health")
async def health():
    return {"ok": True}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
