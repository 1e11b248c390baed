"""``POST /score``: the logprob of every token of a sequence under the weights this replica serves (prompt logprobs:
token ids in, ``[None, lp(t1 | t0), lp(t2 | t0 t1), ...]`` out, the model's raw log-softmax), with the weight version
that computed them. The learner's Tinker mode calls it for ``compute_logprobs`` / ``include_prompt_logprobs``.

An extension router (``extensions: [services.rollout.routes.score:scoring]``; ``fleetrl run`` of a ``mode: tinker``
file adds it to the replicas it starts), for the hf engine only: the forward runs on the engine's own model beside
its decode loop. Weights change only while the engine is paused, and each switch sets a new version: a result is
returned only if the engine was not paused and served the same version before and after the forward (else it is
computed again, up to 3 times)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from services.rollout.errors import RequestError

PAUSE_WAIT_S = 30.0


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_ids: list[int] = Field(min_length=1, max_length=1 << 20)


class ScoreResponse(BaseModel):
    logprobs: list[float | None]
    weight_version: int


class WeightsMoving(RequestError):
    status = 503
    type = "weights_moving"
    retry_after = True


def scoring(service: Any) -> APIRouter:
    router = APIRouter(tags=["score"])

    @router.post("/score", response_model=ScoreResponse)
    async def score(body: ScoreRequest) -> ScoreResponse:
        engine = service.engine
        model = getattr(engine, "model", None)
        if model is None or not hasattr(model, "forward"):
            raise RequestError("/score runs on the hf engine's model; this replica's engine has none")
        vocab = int(model.config.vocab_size)
        ids = body.input_ids
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"input_ids: token ids must lie in [0, {vocab})")
        if engine.context_length and len(ids) > engine.context_length:
            raise RequestError(f"input_ids: {len(ids)} tokens, more than the context of {engine.context_length}")
        deadline = time.monotonic() + PAUSE_WAIT_S
        for _ in range(3):
            while engine.paused:
                if time.monotonic() > deadline:
                    raise WeightsMoving(f"the engine stayed paused (weights loading) for {PAUSE_WAIT_S:g}s")
                await asyncio.sleep(0.05)
            version = engine.weight_version
            lps = await asyncio.to_thread(_logprobs, model, ids, engine.device)
            if not engine.paused and engine.weight_version == version:
                return ScoreResponse(logprobs=[None, *lps], weight_version=version)
        raise WeightsMoving("the weights changed during every try; score again")

    return router


def _logprobs(model: Any, ids: list[int], device: Any) -> list[float]:
    import torch

    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=device)
        logits = model(input_ids=x, use_cache=False).logits[0, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, x[0, 1:].unsqueeze(-1)).squeeze(-1)
    return lp.tolist()
