"""The real ``tinker`` client (PyPI, 0.38.0) against the learner's Tinker mode in its own process, on a tiny
model: a supervised loop whose loss falls, save_state / load_state that resumes exactly, the API key, sampling
with logprobs the trainer agrees with, the RL losses, and bad input answered with a clear error."""

from __future__ import annotations

import math
import os

import pytest

tinker = pytest.importorskip("tinker")
from tinker import types

from shared.ports import free_port
from tests.procs import spawn, stop, wait_http_ok
from tests.tinker.conftest import close

pytestmark = pytest.mark.process  # starts service processes (tests/procs.py)

os.environ["TINKER_TELEMETRY"] = "0"
KEY = "tml-fleetrl-test-key-0123456789"
RL_WARMUP_STEPS = 10
RL_STEPS = 20
RL_LR = 3e-3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from deploy.local.tiny_model import build_tiny_causal_lm

    root = tmp_path_factory.mktemp("tinker")
    # the sort-digits demo's model shape (deploy/local/sort_task.py)
    model = build_tiny_causal_lm(root / "model", hidden_size=128, layers=2, heads=4, max_positions=64, seed=0)
    port = free_port()
    log = root / "server.log"
    env = {"FLEETRL_TINKER_API_KEY": KEY, "FLEETRL_TINKER_BASE_MODEL": str(model),
           "FLEETRL_TINKER_RUN_DIR": str(root / "run"), "FLEETRL_TINKER_TORCH_THREADS": "2",
           "FLEETRL_TINKER_LONG_POLL_S": "5", "FLEETRL_TINKER_MAX_MODELS": "8",
           # a request waiting on a seq_id that never comes would hang the test, not pass late
           "FLEETRL_TINKER_SEQ_GAP_TIMEOUT_S": "600"}
    proc = spawn(["-m", "services.learner.tinker", "--port", str(port)], log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/health", proc, timeout=120, log=log)
        yield {"url": url, "model": str(model), "log": log}
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def service(server):
    """Closed before the server stops: an open client's heartbeat thread outlives the test and logs connection
    errors into later tests' output for minutes."""
    client = tinker.ServiceClient(base_url=server["url"], api_key=KEY)
    yield client
    close(client)


@pytest.fixture(scope="module")
def tok(server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server["model"])


def sl_datum(tok, prompt: str, answer: str) -> types.Datum:
    p, a = tok.encode(prompt), tok.encode(answer) + [tok.eos_token_id]
    ids = p + a
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [0.0] * (len(p) - 1) + [1.0] * len(a)})


def batch(tok, n: int = 16) -> list[types.Datum]:
    return [sl_datum(tok, f"sort {d:04d}=", "".join(sorted(f"{d:04d}"))) for d in range(1000, 1000 + 37 * n, 37)]


def test_supervised_loop_loss_falls_and_state_resumes_exactly(server, service, tok):
    training = service.create_lora_training_client(base_model=server["model"], rank=16, seed=1).result()
    assert training.get_info().lora_rank == 16
    data = batch(tok)
    losses = []
    for _ in range(6):
        fb = training.forward_backward(data, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2))
        out = fb.result()
        losses.append(out.metrics["loss:sum"])
        assert len(out.loss_fn_outputs) == len(data)
        # the loss is the weighted sum of the logprobs the server hands back
        recomputed = -sum(float((o["logprobs"].to_numpy() * d.loss_fn_inputs["weights"].to_numpy()).sum())
                          for o, d in zip(out.loss_fn_outputs, data, strict=True))
        assert recomputed == pytest.approx(losses[-1], rel=1e-4)
    assert losses[-1] < 0.7 * losses[0], losses

    path = training.save_state("resume-me").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/resume-me")
    info = service.create_rest_client().get_weights_info_by_tinker_path(path).result()
    assert (info.is_lora, info.lora_rank, info.base_model) == (True, 16, server["model"])
    expected = training.forward(data, "cross_entropy").result().metrics["loss:sum"]
    # the next step from the saved state, twice: on this model after more training, and on a fresh model
    training.forward_backward(data, "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    training.load_state_with_optimizer(path).result()
    assert training.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(expected, rel=1e-6)
    after_a = _one_step(training, data)
    fresh = service.create_training_client_from_state_with_optimizer(path).result()
    assert fresh.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(expected, rel=1e-6)
    after_b = _one_step(fresh, data)
    assert after_a == pytest.approx(after_b, rel=1e-5)
    # without the optimizer state Adam restarts: the same step lands elsewhere
    plain = service.create_training_client_from_state(path).result()
    assert _one_step(plain, data) != pytest.approx(after_b, rel=1e-3)


def _one_step(training, data) -> float:
    training.forward_backward(data, "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return training.forward(data, "cross_entropy").result().metrics["loss:sum"]


def test_sampling_logprobs_match_the_trainer_and_rl_losses_train(server, service, tok):
    training = service.create_lora_training_client(base_model=server["model"], rank=8, seed=2).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = tok.encode("sort 4213=")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    out = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    assert len(out.sequences) == 4
    again = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in out.sequences]  # the seed decides
    seq = out.sequences[0]
    assert len(seq.logprobs) == len(seq.tokens) and all(lp <= 0 for lp in seq.logprobs)
    # the trainer's logprobs of the sampled tokens are the sampler's (same weights: the ratio is 1)
    ids = prompt + list(seq.tokens)
    n = len(prompt) - 1
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "logprobs": [0.0] * n + list(seq.logprobs),
                                        "advantages": [0.0] * n + [1.0] * len(seq.tokens)})
    trainer_lp = training.forward([datum], "importance_sampling").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert trainer_lp[n:] == pytest.approx(list(seq.logprobs), abs=1e-4)
    # compute_logprobs agrees too (None for the first token)
    prompt_lp = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    assert prompt_lp[0] is None and prompt_lp[1:] == pytest.approx(trainer_lp, abs=1e-4)
    # the cookbook's way: a named sampler checkpoint, then a sampling client from its path (and one on the base)
    path = training.save_weights_for_sampler("step-000").result().path
    assert path.endswith("/sampler_weights/step-000")
    by_path = service.create_sampling_client(model_path=path).result()
    same = by_path.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    assert [s.tokens for s in same.sequences] == [s.tokens for s in out.sequences]
    base = service.create_sampling_client(base_model=server["model"]).result()
    assert len(base.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences) == 2
    # each RL loss takes a step that raises the logprob of a positively-advantaged sample
    for loss_fn in ("importance_sampling", "ppo", "cispo", "dro"):
        before = training.forward([datum], loss_fn).result().loss_fn_outputs[0]["logprobs"].tolist()
        training.forward_backward([datum], loss_fn)
        training.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        after = training.forward([datum], loss_fn).result().loss_fn_outputs[0]["logprobs"].tolist()
        assert sum(after[n:]) > sum(before[n:]), loss_fn
        datum = types.Datum(model_input=datum.model_input,
                            loss_fn_inputs={**datum.loss_fn_inputs, "logprobs": [0.0] * n + after[n:]})


def test_bad_requests_fail_clearly(server, service, tok):
    training = service.create_lora_training_client(base_model=server["model"], rank=4).result()
    data = batch(tok, 2)
    with pytest.raises(tinker.BadRequestError, match="not served"):
        training.forward_backward(data, "no_such_loss").result()
    ragged = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                         loss_fn_inputs={"target_tokens": [6, 7], "weights": [1.0, 1.0]})
    with pytest.raises(Exception, match="shape"):
        training.forward_backward([ragged], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match="not served here"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
    # the refused requests used their seq_ids: the client's next requests run (no wait for a missing seq_id)
    assert training.forward(data, "cross_entropy").result(timeout=120).metrics["loss:sum"] > 0
    with pytest.raises(tinker.BadRequestError, match="checkpoint name"):
        training.save_state("../escape").result()
    assert training.forward(data, "cross_entropy").result(timeout=120).metrics["loss:sum"] > 0


def test_without_the_api_key_every_route_is_401(server):
    import httpx

    wrong = tinker.ServiceClient(base_url=server["url"], api_key="tml-not-the-key-000000")  # connects lazily
    try:
        with pytest.raises(tinker.AuthenticationError, match="wrong X-API-Key"):
            wrong.create_lora_training_client(base_model=server["model"], rank=4).result()
    finally:
        close(wrong)
    for path in ("/api/v1/client/config", "/api/v1/create_session", "/api/v1/retrieve_future",
                 "/api/v1/forward_backward"):
        r = httpx.post(server["url"] + path, json={}, timeout=10)
        assert r.status_code == 401, path
        assert "X-API-Key" in r.text
    assert httpx.get(server["url"] + "/api/v1/get_server_capabilities", timeout=10).status_code == 401
    assert httpx.get(server["url"] + "/health", timeout=10).status_code == 200


def test_retrieve_future_semantics(server):
    import httpx

    h = {"X-API-Key": KEY}
    r = httpx.post(server["url"] + "/api/v1/retrieve_future", json={"request_id": "nope"}, headers=h, timeout=30)
    assert r.status_code == 410  # unknown or expired: the client resubmits
    caps = httpx.get(server["url"] + "/api/v1/get_server_capabilities", headers=h, timeout=30).json()
    assert caps["supported_models"][0]["trainable"] is True
    assert not math.isnan(caps["supported_models"][0]["max_context_length"])



def test_the_other_routes_of_the_client(server, service, tok):
    """The 0.38 client's remaining routes: dynamic_config, cancel_future and unload_model are served; what is not
    (custom losses on the server, the JWT exchange, copy_weights, any other /api/v1 route) is a 400 that says so,
    never a 404 or 500 — and still 401 without the key."""
    import httpx

    h = {"X-API-Key": KEY}
    url = server["url"] + "/api/v1"
    dyn = httpx.post(f"{url}/client/dynamic_config", json={"sdk_version": "0.38.0"}, headers=h, timeout=30).json()
    assert dyn["sample_cancel_enabled"] is True
    for route, says in (("create_custom_loss", "forward_backward_custom"), ("auth/token", "API key"),
                        ("copy_weights", "create_training_client_from_state"), ("training_runs", "not served")):
        r = httpx.post(f"{url}/{route}", json={}, headers=h, timeout=30)
        assert r.status_code == 400 and says in r.text, (route, r.status_code, r.text)
        assert httpx.post(f"{url}/{route}", json={}, timeout=30).status_code == 401
    # cancel_future: a queued request (here: waiting for a seq_id that never comes) is dropped, its future gone
    # (410: the client would resubmit); the model's next requests run
    training = service.create_lora_training_client(base_model=server["model"], rank=4).result()
    data = batch(tok, 4)
    body = {"model_id": training.model_id, "seq_id": 10_000, "adam_params": {"learning_rate": 1.0}}
    queued = httpx.post(f"{url}/optim_step", json=body, headers=h, timeout=30).json()["request_id"]
    pending = httpx.get(server["url"] + "/status", timeout=10).json()["pending"]
    assert httpx.post(f"{url}/cancel_future", json={"request_id": queued}, headers=h, timeout=30).status_code == 200
    assert httpx.post(f"{url}/retrieve_future", json={"request_id": queued}, headers=h, timeout=30).status_code == 410
    assert httpx.get(server["url"] + "/status", timeout=10).json()["pending"] == pending - 1
    assert training.forward(data, "cross_entropy").result().metrics["loss:sum"] > 0
    # unload_model frees the model: its next call is a 404 naming it
    r = httpx.post(f"{url}/unload_model", json={"model_id": training.model_id}, headers=h, timeout=30)
    assert r.status_code == 200 and r.json()["model_id"] == training.model_id
    r = httpx.post(f"{url}/get_info", json={"model_id": training.model_id}, headers=h, timeout=30)
    assert r.status_code == 404 and training.model_id in r.text


def test_closing_the_client_ends_its_session_and_its_models_at_once(server, tinker_client):
    """``ServiceClient.close(status)`` (tinker 0.38) posts ``/api/v1/sessions/{id}/finish``: the session and its
    models end now, not after the heartbeat timeout; a repeated finish is answered the same; an unknown session is
    a 404 that says so. (The route was missing: close() failed, and the session lived on until it timed out.)"""
    import httpx

    h = {"X-API-Key": KEY}
    client = tinker_client(server["url"], KEY)
    training = client.create_lora_training_client(base_model=server["model"], rank=4).result()
    session = training.model_id.split(":", 1)[0]
    before = httpx.get(server["url"] + "/status", timeout=10).json()
    assert training.model_id in before["models"]
    client.close("success", detail="done").result(timeout=60)
    after = httpx.get(server["url"] + "/status", timeout=10).json()
    assert training.model_id not in after["models"] and after["sessions"] == before["sessions"] - 1
    url = f"{server['url']}/api/v1/sessions/{session}/finish"
    again = httpx.post(url, json={"reason": {"type": "errored"}}, headers=h, timeout=30)
    assert again.status_code == 200, again.text
    r = httpx.post(f"{server['url']}/api/v1/sessions/nope/finish", json={"reason": {"type": "success"}}, headers=h,
                   timeout=30)
    assert r.status_code == 404 and "'nope' is unknown" in r.text
    bad = httpx.post(url, json={"reason": {"type": "done"}}, headers=h, timeout=30)
    assert bad.status_code == 400 and "reason" in bad.text
    assert "finished by its client (success: done)" in server["log"].read_text()


def test_rl_loop_learns_the_first_digit_of_sort_digits(server, service, tok):
    """tinker-cookbook's rl_loop shape on sort-digits, sized for the suite: after a short supervised warm-up,
    sample a group per prompt -> reward (the answer's first digit is the smallest one) -> group-centred advantages
    -> forward_backward(importance_sampling) -> optim_step -> save_weights_and_get_sampling_client -> sample
    again. Held-out accuracy at temperature 1 (what RL raises) must rise by 20 points. The whole task
    (exact sorted answer, greedy) is examples/tinker/rl_loop.py: figures in docs/tinker.md."""
    import random

    every = [f"{i:04d}" for i in range(10_000)]
    random.Random(0).shuffle(every)
    held, train = every[:64], every[64:]
    rng = random.Random(1)
    training = service.create_lora_training_client(base_model=server["model"], rank=32, seed=3).result()
    for _ in range(RL_WARMUP_STEPS):
        data = [sl_datum(tok, f"sort {d}=", "".join(sorted(d))) for d in rng.sample(train, 32)]
        training.forward_backward(data, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=3e-3))

    def first_digit_ok(digits: str, seq) -> float:
        return 1.0 if tok.decode(list(seq.tokens)) == min(digits) else 0.0

    def accuracy(sampler) -> float:
        futures = [(d, sampler.sample(types.ModelInput.from_ints(tok.encode(f"sort {d}=")), 4,
                                      types.SamplingParams(max_tokens=1, temperature=1.0, seed=i)))
                   for i, d in enumerate(held)]
        return sum(first_digit_ok(d, s) for d, f in futures for s in f.result().sequences) / (4 * len(held))

    sampler = training.save_weights_and_get_sampling_client().result()
    before = accuracy(sampler)
    for step in range(RL_STEPS):
        rows = rng.sample(train, 8)
        prompts = [tok.encode(f"sort {d}=") for d in rows]
        futures = [sampler.sample(types.ModelInput.from_ints(ids), 8,
                                  types.SamplingParams(max_tokens=1, temperature=1.0, seed=step * 100 + i))
                   for i, ids in enumerate(prompts)]
        batch = []
        for d, ids, fut in zip(rows, prompts, futures, strict=True):
            seqs = fut.result().sequences
            rewards = [first_digit_ok(d, s) for s in seqs]
            mean = sum(rewards) / len(rewards)
            for seq, r in zip(seqs, rewards, strict=True):
                if r != mean:
                    n = len(ids) - 1
                    batch.append(types.Datum(
                        model_input=types.ModelInput.from_ints((ids + list(seq.tokens))[:-1]),
                        loss_fn_inputs={"target_tokens": (ids + list(seq.tokens))[1:],
                                        "logprobs": [0.0] * n + list(seq.logprobs),
                                        "advantages": [0.0] * n + [r - mean] * len(seq.tokens)}))
        if batch:
            training.forward_backward(batch, "importance_sampling")
            training.optim_step(types.AdamParams(learning_rate=RL_LR))
        sampler = training.save_weights_and_get_sampling_client().result()
    after = accuracy(sampler)
    print(f"first-digit accuracy at temperature 1: {before:.3f} -> {after:.3f} in {RL_STEPS} RL steps")
    assert after >= before + 0.2, (before, after)
