"""Sampling on the rollout fleet: the real ``tinker`` client against the learner's Tinker mode with a rollout
replica (hf engine, weight sidecar) and Redis, each a real process. save_weights_for_sampler publishes the trained
weights (LoRA merged) to the replica; the samples come from the replica (its /metrics count them) with logprobs the
trainer agrees with; a sampler the fleet has moved past is served in the learner, from exactly its weights."""

from __future__ import annotations

import os
import re

import httpx
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types

from shared.ports import free_port
from tests.procs import THREAD_ENV, kill9, spawn, stop, wait_http_ok

pytestmark = [pytest.mark.process, pytest.mark.slow]

os.environ["TINKER_TELEMETRY"] = "0"
KEY = "tml-fleetrl-test-key-rollout-0123"
RUN = "tinker-rollout"
FAST = {"INIT_TIMEOUT_S": "20", "COLLECTIVE_TIMEOUT_S": "10", "REGROUP_TIMEOUT_S": "5", "LOAD_TIMEOUT_S": "20",
        "CATCH_UP_POLL_S": "0.1"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, redis_server):
    from deploy.local.tiny_model import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("tinker-rollout")
    model = build_tiny_causal_lm(root / "model", hidden_size=128, layers=2, heads=4, max_positions=64, seed=0)
    rport, tport = free_port(), free_port()
    rollout_url, url = f"http://127.0.0.1:{rport}", f"http://127.0.0.1:{tport}"
    rollout = spawn(["-m", "services.rollout", "--model", str(model), "--port", str(rport), "--engine", "hf",
                     "--device", "cpu", "--redis-url", redis_server.url, "--run-name", RUN], root / "rollout.log",
                    {**THREAD_ENV, "FLEETRL_ROLLOUT_WEIGHT_SIDECAR": "true",
                     "FLEETRL_ROLLOUT_CONTROL_TOKEN": "rollout-test-token",
                     "FLEETRL_ROLLOUT_EXTENSIONS": '["services.rollout.routes.score:scoring"]',  # prompt logprobs
                     "FLEETRL_ROLLOUT_WEIGHTS__HEARTBEAT_S": "0.3", "FLEETRL_ROLLOUT_WEIGHTS__HEARTBEAT_TTL_S": "3"})
    env = {**THREAD_ENV, "FLEETRL_TINKER_API_KEY": KEY, "FLEETRL_TINKER_BASE_MODEL": str(model),
           "FLEETRL_TINKER_RUN_DIR": str(root / "run"), "FLEETRL_TINKER_TORCH_THREADS": "1",
           "FLEETRL_TINKER_LONG_POLL_S": "5", "FLEETRL_TINKER_SEQ_GAP_TIMEOUT_S": "600",
           "FLEETRL_TINKER_ROLLOUT_URLS": f'["{rollout_url}"]', "FLEETRL_TINKER_REDIS_URL": redis_server.url,
           "FLEETRL_TINKER_RUN_NAME": RUN, "FLEETRL_TINKER_SAMPLER_WAIT_S": "30",
           # the client waits for samples through the batched retrieve_futures poller here (and joins clones)
           "FLEETRL_TINKER_SAMPLE_POLLER": "true",
           **{f"FLEETRL_TINKER_WEIGHT_SYNC__{k}": v for k, v in FAST.items()}}
    server = None
    try:
        wait_http_ok(f"{rollout_url}/health", rollout, timeout=120, log=root / "rollout.log")
        server = spawn(["-m", "services.learner.tinker", "--port", str(tport)], root / "server.log", env=env)
        wait_http_ok(f"{url}/health", server, timeout=120, log=root / "server.log")
        yield {"url": url, "rollout": rollout_url, "model": str(model), "root": root}
    finally:
        for proc in (server, rollout):
            if proc is not None:
                try:
                    stop(proc)
                except Exception:  # noqa: BLE001 - the process must not outlive the test
                    kill9(proc)


def generated_on_replica(rollout_url: str) -> float:
    """The replica's own count of answered /generate requests (its Prometheus /metrics)."""
    text = httpx.get(f"{rollout_url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r'fleetrl_rollout_requests_total\{[^}]*route="/generate"[^}]*status="200"'
                                             r'[^}]*\} ([0-9.e+]+)', text))


def sampling_status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()["sampling"]


def sl_datum(tok, prompt: str, answer: str) -> types.Datum:
    p, a = tok.encode(prompt), tok.encode(answer) + [tok.eos_token_id]
    ids = p + a
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [0.0] * (len(p) - 1) + [1.0] * len(a)})


def trainer_logprobs(training, prompt: list[int], seq) -> list[float]:
    ids = prompt + list(seq.tokens)
    n = len(prompt) - 1
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "logprobs": [0.0] * n + list(seq.logprobs),
                                        "advantages": [0.0] * n + [1.0] * len(seq.tokens)})
    out = training.forward([datum], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].tolist()
    return out[n:]


def test_samples_come_from_the_replica_with_the_trainers_logprobs(fleet, tinker_client):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(fleet["model"])
    service = tinker_client(fleet["url"], KEY)
    training = service.create_lora_training_client(base_model=fleet["model"], rank=8, seed=3).result()
    assert sampling_status(fleet["url"])["sampler"] == "rollout"
    data = [sl_datum(tok, f"sort {d:04d}=", "".join(sorted(f"{d:04d}"))) for d in range(1000, 1400, 50)]
    for _ in range(2):  # move the weights off the base model's, so that the replica must load them to agree
        training.forward_backward(data, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=3e-2)).result()

    calls = generated_on_replica(fleet["rollout"])
    sampler = training.save_weights_and_get_sampling_client().result()
    status = sampling_status(fleet["url"])
    assert status["publishes"] == 1 and status["published_version"] == 1 and status["last_publish"]["loaded"] == 1
    version = int(httpx.get(f"{fleet['rollout']}/model_info", timeout=10).json()["weight_version"])
    assert version == 1

    prompt = tok.encode("sort 4213=")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    out = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    assert len(out.sequences) == 4
    assert generated_on_replica(fleet["rollout"]) == calls + 1  # the replica sampled it...
    status = sampling_status(fleet["url"])
    assert status["samples_on_rollout"] == 1 and status["samples_in_learner"] == 0  # ...not the learner
    for seq in out.sequences:  # the trained weights, as the trainer holds them (LoRA merged on the replica)
        assert len(seq.logprobs) == len(seq.tokens) > 0
        assert trainer_logprobs(training, prompt, seq) == pytest.approx(list(seq.logprobs), abs=2e-4)
    # compute_logprobs: the replica's /score, of the same version, agrees with the trainer too
    first = out.sequences[0]
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + list(first.tokens))).result()
    assert scored[0] is None and scored[len(prompt):] == pytest.approx(list(first.logprobs), abs=2e-4)
    status = sampling_status(fleet["url"])
    assert status["prompt_logprobs_on_rollout"] == 1 and status["samples_in_learner"] == 0
    r = httpx.post(f"{fleet['rollout']}/score", json={"input_ids": [0, 10**9]}, timeout=10)
    assert r.status_code == 400 and "token ids must lie" in r.text

    # one more step and a new sampler: version 2 on the replica; the first sampler, bound to version 1, is now
    # served in the learner from its own checkpoint (exactly its weights), never from the replica's newer ones
    training.forward_backward(data, "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=3e-2)).result()
    sampler2 = training.save_weights_and_get_sampling_client().result()
    assert sampling_status(fleet["url"])["published_version"] == 2
    new = sampler2.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    for seq in new.sequences:
        assert trainer_logprobs(training, prompt, seq) == pytest.approx(list(seq.logprobs), abs=2e-4)
    # a copy of a sampling client (pickled: the client's own bytes, in this process) joins the sampling session
    # as clone 1 and waits through its own poller target
    import pickle

    clone = pickle.loads(pickle.dumps(sampler2))  # the client's own pickle, made in this process
    again2 = clone.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    assert [s.tokens for s in again2.sequences] == [s.tokens for s in new.sequences]  # the seed decides
    status = sampling_status(fleet["url"])
    assert status["joined_clones"] == 1 and status["retrieve_futures_polls"] > 0
    calls = generated_on_replica(fleet["rollout"])
    old = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    assert generated_on_replica(fleet["rollout"]) == calls
    assert [s.tokens for s in old.sequences] != [] and sampling_status(fleet["url"])["samples_in_learner"] == 1
    # logprobs of the old weights (in the learner now): the first sample's tokens score as before
    again = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + list(first.tokens))).result()
    assert again[len(prompt):] == pytest.approx(list(first.logprobs), abs=2e-4)


def test_fleetrl_run_starts_the_rollout_fleet_that_samples(tiny_model_dir, tmp_path, tinker_client):
    """``fleetrl run FILE`` with ``mode: tinker`` and ``replicas: {rollout: 1}``: Redis, a rollout replica and the
    Tinker API, sampling on the replica; Ctrl-C (SIGTERM here) stops all of them."""
    import time

    import yaml

    from tests.procs import REPO

    example = yaml.safe_load((REPO / "examples/tinker/fleetrl-rollout.yaml").read_text())
    assert example["mode"] == "tinker" and example["replicas"] == {"rollout": 1}
    port = free_port()
    spec = tmp_path / "fleetrl.yaml"
    spec.write_text(yaml.safe_dump({**example, "base_model": "model", "port": port, "run_dir": "run",
                                    "torch_threads": 1, "rollout": {**example.get("rollout", {}),
                                                                    "engine": {"kind": "hf", "device": "cpu"}}}))
    (tmp_path / "model").symlink_to(tiny_model_dir)
    log = tmp_path / "out.log"
    proc = spawn(["-m", "deploy.cli", "run", str(spec)], log, {"OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 180
        while "TINKER_API_KEY=" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.25)
        lines = dict(line.removeprefix("export ").split("=", 1) for line in log.read_text().splitlines()
                     if line.startswith("export TINKER_"))
        url = lines["TINKER_BASE_URL"]
        wait_http_ok(f"{url}/health", proc, timeout=120, log=log)
        status = sampling_status(url)
        assert status["sampler"] == "rollout" and len(status["rollout_urls"]) == 1, status
        rollout_url = status["rollout_urls"][0]
        service = tinker_client(url, lines["TINKER_API_KEY"])
        sampler = service.create_sampling_client(base_model=str(tmp_path / "model")).result()
        out = sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 2,
                             types.SamplingParams(max_tokens=4, temperature=1.0, seed=1)).result()
        assert len(out.sequences) == 2
        assert sampling_status(url)["samples_on_rollout"] == 1 and generated_on_replica(rollout_url) == 1
    finally:
        stop(proc, timeout=60)
    with pytest.raises(httpx.HTTPError):  # the replica went with it
        httpx.get(f"{rollout_url}/health", timeout=5)
