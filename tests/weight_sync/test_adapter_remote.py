"""Adapter rounds into engine servers, in one process: a real publisher and a real weight sidecar (receiver, gloo
group, Redis) around the real vLLM / SGLang engine clients, whose HTTP goes to an in-process stand-in of the
server's runtime LoRA API (vLLM ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, SGLang
``/load_lora_adapter`` / ``/unload_lora_adapter``) and of its generation route. The stand-in reads the adapter
directory the way the servers do (PEFT's ``adapter_config.json`` and ``adapter_model.safetensors``), refuses a name
already loaded (as vLLM does), and records which adapter each generation named."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from services.learner.training.models import adapter_weights
from services.learner.weights import WeightPublisher
from services.rollout.engines.settings import SGLangEngineSettings, VLLMEngineSettings
from services.rollout.engines.sglang import SGLangEngine
from services.rollout.engines.types import SamplingParams, SequenceRequest
from services.rollout.engines.vllm import VLLMEngine
from services.rollout.weights.settings import SidecarSettings
from services.rollout.weights.sidecar import WeightSidecar
from shared.weight_sync import WeightSyncSettings
from tests.weight_sync.conftest import wait_alive
from tests.weight_sync.test_adapter_rounds import FAST, learner, train_step

ROUTES = {"vllm": ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/completions"),
          "sglang": ("/load_lora_adapter", "/unload_lora_adapter", "/generate")}


def standin(kind: str) -> tuple[FastAPI, dict]:
    from safetensors.torch import load_file

    load, unload, generate = ROUTES[kind]
    app = FastAPI()
    state: dict = {"loaded": {}, "calls": [], "generated_with": []}

    @app.post(load)
    async def load_adapter(body: dict):
        name, path = body["lora_name"], Path(body["lora_path"])
        state["calls"].append(("load", name))
        if name in state["loaded"]:
            return JSONResponse(status_code=400, content={"message": f"The lora adapter '{name}' has already been "
                                                                      "loaded."})
        config = json.loads((path / "adapter_config.json").read_text())
        state["loaded"][name] = (config, load_file(str(path / "adapter_model.safetensors")))
        return {"success": True, "message": "ok"} if kind == "sglang" else JSONResponse("Success")

    @app.post(unload)
    async def unload_adapter(body: dict):
        state["calls"].append(("unload", body["lora_name"]))
        if state["loaded"].pop(body["lora_name"], None) is None:
            return JSONResponse(status_code=404, content={"message": "not loaded"})
        return {"success": True} if kind == "sglang" else JSONResponse("Success")

    @app.post(generate)
    async def gen(body: dict):
        if kind == "vllm":
            state["generated_with"].append(body["model"])
            return {"choices": [{"token_ids": [7], "text": "x", "finish_reason": "length",
                                 "logprobs": {"token_logprobs": [-0.5]}}]}
        state["generated_with"].append(body.get("lora_path"))
        return {"output_ids": [7], "text": "x", "meta_info": {"output_token_logprobs": [[-0.5, 7]],
                                                              "finish_reason": {"type": "length", "length": 1}}}

    return app, state


async def engine_for(kind: str, model_dir, app: FastAPI):
    cls, settings = (VLLMEngine, VLLMEngineSettings) if kind == "vllm" else (SGLangEngine, SGLangEngineSettings)
    engine = cls(settings(base_url="http://127.0.0.1:9", connect_timeout_s=1.0), str(model_dir))
    await engine.start()  # (SGLang asks /model_info of a port nobody serves: logged, not fatal)
    for attr in ("client", "control"):
        await getattr(engine, attr).aclose()
        setattr(engine, attr, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://standin",
                                                timeout=10.0))
    return engine


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_engine_servers_load_each_version_as_an_adapter_and_keep_the_newest(
        kind, redis_client, tiny_model_dir, tmp_path, threads):
    run = f"adapter-remote-{kind}"
    app, state = standin(kind)
    engine = await engine_for(kind, tiny_model_dir, app)
    sc = WeightSidecar(engine, redis_client, run, SidecarSettings(
        join_timeout_s=0, heartbeat_s=0.2, heartbeat_ttl_s=10.0, adapters="on", adapters_resident=2,
        adapter_dir=str(tmp_path / "adapters")), name=kind)
    await sc.start()
    actor = learner(tiny_model_dir)
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(**FAST)) as pub:
            await wait_alive(pub, 1)
            for step in range(4):
                train_step(actor, step)
                weights = adapter_weights(actor)
                v = await pub.publish(weights)
                assert set(pub.last_report.round_bytes) == {"adapter"} and pub.last_report.loaded == [sc.replica_id]
                name = f"fleetrl-v{v}"
                config, tensors = state["loaded"][name]
                assert (config["r"], config["lora_alpha"]) == (4, 8.0)
                assert sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
                want = {f"base_model.model.{n.rsplit('.', 1)[0]}.{n.rsplit('.', 1)[1]}.weight": t
                        for n, t in weights.tensors}
                assert sorted(tensors) == sorted(want)
                assert all(torch.equal(tensors[k], want[k]) for k in want)
                # only the newest adapters_resident versions stay loaded, on the server and on disk
                assert sorted(state["loaded"]) == sorted(f"fleetrl-v{x}" for x in range(max(1, v - 1), v + 1))
                assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == sorted(state["loaded"])
                # a sample names the adapter of the version it records
                out = await engine.generate(SequenceRequest(rid=f"r{v}", prompt_ids=(1, 2, 3),
                                                            params=SamplingParams(max_new_tokens=1)))
                assert out.weight_version == v and state["generated_with"][-1] == name
            assert [c for c in state["calls"] if c[0] == "unload"] == [("unload", "fleetrl-v1"), ("unload", "fleetrl-v2")]
    finally:
        await sc.stop()
        await engine.stop()


async def test_a_server_without_adapters_on_advertises_none(redis_client, tiny_model_dir, threads):
    """The default for engine servers (LoRA needs enabling at their start): they get merged full rounds."""
    app, _ = standin("vllm")
    engine = await engine_for("vllm", tiny_model_dir, app)
    sc = WeightSidecar(engine, redis_client, "adapter-remote-off", SidecarSettings(join_timeout_s=0), name="v")
    try:
        assert sc.info().adapters is False
        sc_on = WeightSidecar(engine, redis_client, "adapter-remote-off", SidecarSettings(adapters="on"), name="w")
        assert sc_on.info().adapters is True
        await asyncio.sleep(0)
    finally:
        await engine.stop()


async def test_a_server_whose_base_a_full_round_replaced_refuses_adapter_rounds(
        redis_client, tiny_model_dir, tmp_path, threads):
    # an engine server that took a full version (a mixed fleet's merged round) serves base + that merge: an adapter
    # loaded on top would apply to the merged weights. It refuses, loads nothing, and stops advertising adapters
    run = "adapter-remote-replaced"
    app, state = standin("vllm")
    engine = await engine_for("vllm", tiny_model_dir, app)
    sc = WeightSidecar(engine, redis_client, run, SidecarSettings(
        join_timeout_s=0, heartbeat_s=0.2, heartbeat_ttl_s=10.0, adapters="on",
        adapter_dir=str(tmp_path / "adapters")), name="v")
    await sc.start()
    actor = learner(tiny_model_dir)
    try:
        async with WeightPublisher(redis_client, run, WeightSyncSettings(**FAST)) as pub:
            await wait_alive(pub, 1)
            train_step(actor, 0)
            engine.set_weight_version(await pub.publish(adapter_weights(actor)))  # as a full round leaves it
            train_step(actor, 1)
            await pub.publish(adapter_weights(actor))
            r = pub.last_report
            assert set(r.round_bytes) == {"adapter"} and r.refused == [sc.replica_id] and not r.loaded, r
            assert list(state["loaded"]) == ["fleetrl-v1"]  # the first version only
            assert sc.info().adapters is False  # merged full rounds from now on
    finally:
        await sc.stop()
        await engine.stop()
