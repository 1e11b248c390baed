"""The sglang and vllm engines against a stand-in server (own process) that speaks their documented HTTP
protocols: request mapping, responses, streaming, logprobs, finish reasons."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from shared.ports import free_port
from tests.procs import spawn, starts_processes, stop, wait_http_ok
from tests.rollout.conftest import THREAD_ENV, start_rollout
from tests.rollout.standin_engine import tokens_for

pytestmark = pytest.mark.process  # stand-in engine servers and rollout services as processes


@pytest.fixture(scope="module")
@starts_processes
def standin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standin")
    port = free_port()
    proc = spawn(["-m", "tests.rollout.standin_engine", "--port", str(port)], tmp / "standin.log", env=THREAD_ENV)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/health", proc, timeout=60, log=tmp / "standin.log")
    yield url
    stop(proc)


@pytest.fixture(scope="module", params=["sglang", "vllm"])
@starts_processes
def remote_rollout(request, standin, tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"remote-{request.param}")
    config = {"model": str(tiny_model_dir), "served_model_name": "tiny",
              "engine": {"kind": request.param, "base_url": standin, **({"served_model_name": "served-tiny"}
                                                                       if request.param == "vllm" else {})}}
    proc, url, _ = start_rollout(tmp, f"rollout-{request.param}", config)
    yield request.param, url
    stop(proc)


def test_generate_maps_request_and_response(remote_rollout, standin):
    kind, url = remote_rollout
    body = {"input_ids": [10, 20, 30], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0.5, "top_k": 7, "sampling_seed": 11}}
    r = httpx.post(f"{url}/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()
    ids, lps, _ = tokens_for([10, 20, 30], 6, [])
    assert out["output_ids"] == ids
    assert [t[0] for t in out["meta_info"]["output_token_logprobs"]] == pytest.approx(lps)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    # the server's integer version adopted (SGLang's /model_info, vLLM 0.33's /weight_info)
    assert out["meta_info"]["weight_version"] == ("3" if kind == "sglang" else "5")
    sent = httpx.get(f"{standin}/_last/{'generate' if kind == 'sglang' else 'completions'}", timeout=5).json()
    if kind == "sglang":
        assert sent["input_ids"] == [10, 20, 30] and sent["return_logprob"] is True
        assert sent["sampling_params"]["sampling_seed"] == 11 and sent["sampling_params"]["top_k"] == 7
    else:
        assert sent["prompt"] == [10, 20, 30] and sent["model"] == "served-tiny"
        assert sent["seed"] == 11 and sent["top_k"] == 7 and sent["max_tokens"] == 6 and sent["return_token_ids"]


def test_optional_features_pass_through_in_each_servers_names(remote_rollout, standin):
    kind, url = remote_rollout
    sp = {"max_new_tokens": 6, "min_new_tokens": 2, "frequency_penalty": 0.5, "repetition_penalty": 1.2,
          "spaces_between_special_tokens": False, "json_schema": '{"type": "object"}'}
    r = httpx.post(f"{url}/generate", json={"input_ids": [10, 20], "sampling_params": sp}, timeout=30)
    assert r.status_code == 200, r.text
    sent = httpx.get(f"{standin}/_last/{'generate' if kind == 'sglang' else 'completions'}", timeout=5).json()
    if kind == "sglang":
        got = {k: sent["sampling_params"].get(k) for k in sp if k != "max_new_tokens"}
        assert got == {k: v for k, v in sp.items() if k != "max_new_tokens"}
    else:
        assert (sent["min_tokens"], sent["frequency_penalty"], sent["repetition_penalty"]) == (2, 0.5, 1.2)
        assert sent["spaces_between_special_tokens"] is False
        assert sent["structured_outputs"] == {"json": {"type": "object"}}
    plain = httpx.post(f"{url}/generate", json={"input_ids": [10, 20], "sampling_params": {"max_new_tokens": 2}},
                       timeout=30)
    assert plain.status_code == 200, plain.text
    sent = httpx.get(f"{standin}/_last/{'generate' if kind == 'sglang' else 'completions'}", timeout=5).json()
    fields = sent["sampling_params"] if kind == "sglang" else sent
    assert not {"min_new_tokens", "min_tokens", "json_schema", "structured_outputs"} & set(fields)  # defaults: unsent


def test_a_forced_tool_call_reaches_the_server_as_its_json_schema(remote_rollout, standin):
    kind, url = remote_rollout
    params = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    sent = httpx.get(f"{standin}/_last/{'generate' if kind == 'sglang' else 'completions'}", timeout=5).json()
    want = {**params, "x-guidance": {"whitespace_flexible": False}}
    if kind == "sglang":
        assert json.loads(sent["sampling_params"]["json_schema"]) == want
    else:
        assert sent["structured_outputs"] == {"json": want}


def test_prompt_logprobs_come_from_each_server(remote_rollout, standin):
    kind, url = remote_rollout
    body = {"input_ids": [10, 20, 30, 40], "return_logprob": True, "logprob_start_len": 1,
            "sampling_params": {"max_new_tokens": 0}}
    r = httpx.post(f"{url}/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()["meta_info"]["input_token_logprobs"]
    assert got == [[-0.02, 20, None], [-0.03, 30, None], [-0.04, 40, None]]  # the stand-in's -t / 1000
    if kind == "sglang":
        sent = httpx.get(f"{standin}/_last/generate", timeout=5).json()
        assert sent["logprob_start_len"] == 1 and sent["sampling_params"] == {"max_new_tokens": 0}
    else:
        sent = httpx.get(f"{standin}/_last/completions", timeout=5).json()
        assert sent["prompt"] == [10, 20, 30, 40] and sent["prompt_logprobs"] == 0


def test_a_feature_the_engine_lacks_is_refused_naming_it_and_the_engine(remote_rollout):
    kind, url = remote_rollout
    r = httpx.post(f"{url}/generate", json={"input_ids": [10, 20], "sampling_params": {"max_new_tokens": 2,
                                                                                       "stop_regex": "x+"}}, timeout=30)
    if kind == "sglang":
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400 and "stop_regex: the `vllm` engine" in r.json()["detail"], r.text
    r = httpx.post(f"{url}/generate", json={"input_ids": [10, 20], "lora_path": "adapter"}, timeout=30)
    assert r.status_code == 400 and f"lora_path='adapter': not supported by the `{kind}` engine" in r.json()["detail"]


def test_stop_token_and_openai_route(remote_rollout):
    _, url = remote_rollout
    ids, _, _ = tokens_for([1, 2], 10, [])
    stop_id = ids[3]
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 10, "logprobs": 0,
                                                  "stop_token_ids": [stop_id], "return_token_ids": True}, timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == ids[: ids.index(stop_id) + 1]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id


def test_streaming_through_remote_engine(remote_rollout):
    _, url = remote_rollout
    body = {"input_ids": [4, 5], "stream": True, "return_logprob": True, "sampling_params": {"max_new_tokens": 5}}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=30) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[5:]) for ln in lines[:-1]]
    ids, lps, _ = tokens_for([4, 5], 5, [])
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1]["output_ids"] == ids
    assert [t[0] for t in chunks[-1]["meta_info"]["output_token_logprobs"]] == pytest.approx(lps)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_health_and_model_info(remote_rollout):
    kind, url = remote_rollout
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{url}/model_info", timeout=10).json()["engine"] == kind


def test_engine_server_down_is_503_not_500(tiny_model_dir, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url, _ = None, None, None
    port = free_port()
    cfg = tmp_path / "dead.yaml"
    cfg.write_text(json.dumps({"model": str(tiny_model_dir), "port": port, "engine": {"kind": "sglang", "base_url": dead}}))
    proc = spawn(["-m", "services.rollout", "--config", str(cfg)], tmp_path / "dead.log", env=THREAD_ENV)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/model_info", proc, timeout=60, log=tmp_path / "dead.log")
        assert httpx.get(f"{url}/health", timeout=30).status_code == 503
        r = httpx.post(f"{url}/generate", json={"input_ids": [1, 2]}, timeout=30)
        assert r.status_code == 503 and "engine server" in r.json()["detail"]
    finally:
        stop(proc)


async def test_health_answers_while_every_pooled_connection_is_generating(standin, tiny_model_dir, tmp_path):
    """Issue 17 #7 for the remote engines: health checks have connections of their own, so a server whose
    generation pool is full (here 2 connections, both streaming) is not reported dead."""
    config = {"model": str(tiny_model_dir), "engine": {"kind": "vllm", "base_url": standin, "max_connections": 2,
                                                        "context_length": 100_000, "health_timeout_s": 2.0}}
    proc, url, _ = start_rollout(tmp_path, "pool", config)
    body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 20_000}}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            streams = [await c.send(c.build_request("POST", "/generate", json=body), stream=True) for _ in range(2)]
            lines = [s.aiter_lines() for s in streams]  # kept: a dropped iterator closes its stream when collected
            for s, it in zip(streams, lines):  # both are generating, each holding one of the engine client's 2 connections
                assert s.status_code == 200 and (await it.__anext__()).startswith("data: {")
            for _ in range(3):
                started = time.monotonic()
                assert (await c.get("/health")).status_code == 200
                assert time.monotonic() - started < 1.0
            metrics = (await c.get("/metrics")).text
            assert "fleetrl_rollout_inflight_sequences 2.0" in metrics  # they were generating all along
            for s in streams:
                await s.aclose()
    finally:
        stop(proc)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_the_engine_api_key_is_a_secret_never_printed(tiny_model_dir, kind):
    """engine.api_key is a SecretStr: not in the settings' repr or dumps (what logs and errors show), still sent."""
    from services.rollout.engines.base import create_engine
    from services.rollout.settings import RolloutSettings

    s = RolloutSettings(model=str(tiny_model_dir), engine={"kind": kind, "base_url": "http://127.0.0.1:9",
                                                           "api_key": "sk-very-secret"})
    for shown in (repr(s), str(s), str(s.model_dump()), s.model_dump_json(), repr(s.engine)):
        assert "sk-very-secret" not in shown
    engine = create_engine(s.engine, s.model)
    await engine._start()
    try:
        assert engine.client.headers["authorization"] == "Bearer sk-very-secret"
        assert engine.control.headers["authorization"] == "Bearer sk-very-secret"
    finally:
        await engine._stop()
