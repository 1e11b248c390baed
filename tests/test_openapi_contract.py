"""Every route of the three services answers within its own OpenAPI spec (schemathesis, in-process).

Each app is built by its own ``create_app`` and driven in-process over ASGI (schemathesis runs its
lifespan, so the service object really starts). For every operation schemathesis generates valid
(positive) and invalid (negative) requests, sends each with and without the control token, and checks
the answer against the spec: no 5xx, a declared status code, the declared content type, headers, a body
that validates against the declared schema, and invalid input refused. Every example runs (no stop at
the first failure), and the test fails listing each distinct violation (operation, check).

One schemathesis check is left out: ``positive_data_acceptance`` (a request the schema allows must not
get a 4xx other than 401/403/404/409). Both generating services refuse some schema-valid requests on
purpose, with a declared 400/422 that says why: a token id past the vocabulary, a prompt longer than the
context, ``n`` over the server's limit, a verifier item without its label. JSON Schema cannot express
those rules (they depend on the model and the configuration).

What runs for real and what stands in:

- rollout: the real app and service on the hf engine with the tiny model (``pause_wait_s`` short, so a
  request that meets paused generation answers 503 at once). ``/pause_generation`` runs last: a pause
  in the middle would turn the other operations' answers into 503s.
- reward: the real app and service with rule scorers.
- learner: the real app and ``LearnerService``; only the training run is a stand-in runner (same
  ``status()`` keys as the RL runner), since a real one needs Redis, a model and minutes of training.
  ``/stop`` runs last for the same reason as the pause above.
- The weight routes (``/weights/*``) are not in the rollout app here: the sidecar they serve needs a
  Redis and a learner publishing weights, which cannot be set up in-process; their contract is tested
  in tests/weight_sync.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

pytestmark = pytest.mark.slow  # in-process, but schemathesis drives every route of three apps (~50-60 s)

TOKEN = "contract-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = int(os.environ.get("FLEETRL_CONTRACT_EXAMPLES", "20"))  # per operation, mode and auth
LAST = ("/pause_generation", "/continue_generation", "/stop")  # ops that change the service for later ones

# Requests that succeed, beside the generated ones (which rarely get past the model-dependent checks of the
# generation routes): their 200 bodies and streams are checked against the spec too.
GOOD: dict[str, list[dict[str, Any]]] = {
    "/generate": [
        {"text": "1+1=", "sampling_params": {"max_new_tokens": 3}},
        {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2, "n": 2}, "return_logprob": True,
         "top_logprobs_num": 2, "return_text_in_logprobs": True},
        {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}, "stream": True},
    ],
    "/v1/completions": [
        {"model": "tiny", "prompt": "1+1=", "max_tokens": 3, "logprobs": 2},
        {"model": "tiny", "prompt": "1+1=", "max_tokens": 3, "logprobs": 0},  # its logprobs object was off-spec
        {"model": "tiny", "prompt": "1+1=", "max_tokens": 3, "logprobs": 0, "stream": True},
        {"model": "tiny", "prompt": "1+1=", "max_tokens": 3, "n": 2, "stream": True,
         "stream_options": {"include_usage": True}},
    ],
    "/v1/chat/completions": [
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True,
         "top_logprobs": 2, "return_token_ids": True},
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True},
    ],
    "/get_reward": [{"query": ["1+1=2"], "prompts": ["1+1="], "labels": ["2"]}],
    "/score": [{"items": [{"prompt": "1+1=", "response": "2", "label": "2"}]}],
}


# ---- the apps --------------------------------------------------------------------------------------------
def rollout_app(model_dir: Path, tmp: Path, monkeypatch):
    from services.rollout.app import create_app
    from services.rollout.settings import RolloutSettings

    settings = RolloutSettings(
        model=str(model_dir), served_model_name="tiny", control_token=TOKEN,
        # a 64-token context: a generated request that sets no max_tokens samples until the context is full (the
        # tiny model seldom says EOS), ~500 tokens at the model's own 512; what is checked is the answer's shape
        engine={"kind": "hf", "device": "cpu", "max_batch_size": 16, "max_wait_ms": 1, "torch_threads": 1,
                "context_length": 64},
        limits={"max_inflight_sequences": 64, "max_body_bytes": 64 * 1024, "pause_wait_s": 0.05,
                "max_prompts_per_request": 4, "max_n": 4},
    )
    return create_app(settings)


def reward_app(model_dir: Path, tmp: Path, monkeypatch):
    from services.reward.app import create_app
    from services.reward.settings import RewardSettings

    settings = RewardSettings(scorers=[
        {"name": "len", "kind": "rule", "check": {"type": "length", "max_length": 50}},
        {"name": "math", "kind": "rule", "check": {"type": "math"}, "on_error": "mark"},
    ], auth_token=TOKEN)
    return create_app(settings)


class StandInRunner:
    """The learner's run, without training: phases and status keys as the RL runner has them."""

    needs_redis = False

    def __init__(self, settings, redis, sink) -> None:
        self.settings = settings
        self.phase = "starting"
        self.error: str | None = None
        self.step = 0

    async def run(self, stop: asyncio.Event) -> None:
        self.phase = "running"
        await stop.wait()
        self.phase = "stopped"

    def request_checkpoint(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result({"step": self.step, "path": "/tmp/checkpoints/step_0"})
        return fut

    def status(self) -> dict[str, Any]:
        return {"phase": self.phase, "error": self.error, "algorithm": "grpo", "step": self.step, "total_steps": 10,
                "weight_version": 0, "epoch": 0, "next_index": 0, "prompts_in_flight": 0, "groups_buffered": 0,
                "groups_complete": 0, "counters": {}, "staleness_histogram": {}, "abandoned": {},
                "last_checkpoint": None, "ranks": 1, "replica_digests": [], "last_metrics": {}, "last_publish": None}


def learner_app(model_dir: Path, tmp: Path, monkeypatch):
    from services.learner.algorithms.rl_algorithms import GRPO
    from services.learner.app import create_app
    from services.learner.settings import LearnerSettings

    prompts = tmp / "prompts.jsonl"
    prompts.write_text('{"input": "1+1=", "label": 2}\n')
    settings = LearnerSettings(model={"actor": str(model_dir), "device": "cpu"}, data={"path": str(prompts)},
                               run_dir=str(tmp / "run"), control_token=TOKEN, exit_when_done=False,
                               observability={"progress_bar": False})
    monkeypatch.setattr(GRPO, "runner", StandInRunner)  # the runner is what the algorithm registered
    return create_app(settings)


APPS: dict[str, Callable] = {"rollout": rollout_app, "reward": reward_app, "learner": learner_app}


# ---- the run ---------------------------------------------------------------------------------------------
def _violations(exc: BaseException) -> list[Failure]:
    if isinstance(exc, FailureGroup):
        return list(exc.exceptions)
    if isinstance(exc, Failure):
        return [exc]
    raise exc


def _validate(case, label: str, found: dict[tuple, str]) -> None:
    for headers in (AUTH, None):
        try:
            # a generous read timeout: what is checked is the answer's shape, not the speed of a loaded machine (a
            # generation route at 10 s, schemathesis's default, timed out under a load average of 10)
            case.call_and_validate(headers=headers, excluded_checks=[positive_data_acceptance], timeout=120)
        except (Failure, FailureGroup) as exc:
            for failure in _violations(exc):
                found.setdefault((label, failure.title), f"{failure.title}: {failure.message[:300]}")


def check_operation(operation, found: dict[tuple, str]) -> None:
    """Run the operation's known-good requests and generated examples; record each distinct violation (the
    first message for it)."""
    label = f"{operation.method.upper()} {operation.path}"
    for body in GOOD.get(operation.path, []):
        _validate(operation.Case(body=body, media_type="application/json"), label, found)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategy = operation.as_strategy(generation_mode=mode)

        @given(case=strategy)
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=False,
                  suppress_health_check=list(HealthCheck))
        def run(case) -> None:
            _validate(case, label, found)

        try:
            run()
        except Unsatisfiable:
            if mode is GenerationMode.POSITIVE:
                raise  # an operation without inputs has no invalid request: only the negative mode may be empty


@pytest.mark.parametrize("service", sorted(APPS))
def test_every_route_answers_within_its_spec(service, tiny_model_dir, tmp_path, monkeypatch):
    app = APPS[service](tiny_model_dir, tmp_path, monkeypatch)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    operations.sort(key=lambda op: op.path in LAST)
    found: dict[tuple, str] = {}
    try:
        for operation in operations:
            check_operation(operation, found)
    finally:
        from schemathesis.python import asgi

        asgi.shutdown_lifespans()
    report = "\n".join(f"  {op} [{check}] {msg}" for (op, check), msg in sorted(found.items()))
    assert not found, f"{len(found)} spec violation(s) on the {service} service:\n{report}"
