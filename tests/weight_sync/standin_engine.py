"""A stand-in for an SGLang or vLLM server's weight endpoints (not their generation): it runs the
receiving side of the broadcast itself, the way those servers do, and keeps what arrived so that a test
can check the bytes. Run: ``python -m tests.weight_sync.standin_engine PORT [VLLM_API]``.

vLLM moved the packed-transfer parameters (``packed``, ``packed_buffer_size_bytes``, ``packed_num_buffers``)
from the per-round update info to the init info; both sides reject a field their dataclass lacks.
``VLLM_API`` picks which release to imitate: ``update`` (the parameters travel with /update_weights, the
default) or ``init`` (they travel with /init_weight_transfer_engine).

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
VLLM_API = sys.argv[2] if len(sys.argv) > 2 else "update"
WIRE = ("packed", "packed_buffer_size_bytes", "packed_num_buffers")


def _strict(cls_name: str, info: dict, allowed: tuple[str, ...]):
    """What vLLM answers when its info dataclass gets a field it does not have (a TypeError, reported)."""
    from fastapi.responses import JSONResponse

    extra = [k for k in info if k not in allowed]
    if extra:
        return JSONResponse(status_code=400, content={
            "error": f"{cls_name}.__init__() got an unexpected keyword argument '{extra[0]}'"})
    return None


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


# ---- vLLM --------------------------------------------------------------------------------------------
@app.post("/init_weight_transfer_engine")
async def init_engine(body: dict):
    info = body["init_info"]
    base = ("master_address", "master_port", "rank_offset", "world_size")
    bad = _strict("NCCLWeightTransferInitInfo", info, base + (WIRE if VLLM_API == "init" else ()))
    if bad is not None:
        return bad
    if VLLM_API == "init":
        state["wire"] = {k: info[k] for k in WIRE}
    old = state["groups"].pop("vllm", None)
    if old is not None:  # vLLM replaces its engine's group (the new one may reuse the old one's port, so name)
        dist.destroy_process_group(old)
    pg = await asyncio.to_thread(_form, info["master_address"], info["master_port"], info["rank_offset"],
                                 info["world_size"], f"fleetrl-weights-{info['master_port']}", "gloo")
    state["groups"]["vllm"] = pg
    return _ok("/init_weight_transfer_engine", body)


@app.post("/start_weight_update")
async def start_update(body: dict | None = None):
    return _ok("/start_weight_update", body or {})


@app.post("/update_weights")
async def update_weights(body: dict):
    info = body["update_info"]
    base = ("names", "dtype_names", "shapes")
    bad = _strict("NCCLWeightTransferUpdateInfo", info, base + (WIRE if VLLM_API == "update" else ()))
    if bad is not None:
        return bad
    wire = state["wire"] if VLLM_API == "init" else info
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


@app.post("/finish_weight_update")
async def finish_update(body: dict | None = None):
    return _ok("/finish_weight_update", body or {})


# ---- for the test ------------------------------------------------------------------------------------
@app.get("/standin/state")
async def dump():
    sums = {n: zlib.crc32(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))
            for n, t in state["weights"].items()}
    return {"crc": sums, "calls": [c["path"] for c in state["calls"]], "weight_version": state["weight_version"],
            "groups": list(state["groups"])}


@app.get("/health")
async def health():
    return {"ok": True}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
