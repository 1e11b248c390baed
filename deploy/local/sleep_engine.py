"""A rollout engine whose generation time is a sleep per token, for measuring an elastic pool on a small machine.

``benchmarks/elastic.py`` needs replicas that really add throughput on two CPU cores: a real engine's time
comes from those cores, so a fourth replica would only share them. :class:`SleepEngine` is the hf engine (it
loads the tiny model, so weight sync, the hf weight sink and peer serving are the real ones) whose generation is
scripted instead: the answer to a prompt that says ``count N`` is ``N`` digits (``0123456789`` repeated) then
EOS, one token every ``FLEETRL_SLEEP_TOKEN_S`` seconds (default 0.02). Sequences in flight sleep side by side,
as a batch would on an accelerator; a replica's capacity is what its worker takes at a time
(``worker.concurrency``).

It is registered as the engine kind ``sleep`` (``ENGINES.register``) by an extension the operator names in the
rollout settings, never by a request::

    services:
      rollout:
        engine: {kind: hf, device: cpu}                     # the settings union has no "sleep" kind (yet):
        extensions: ["deploy.local.sleep_engine:install"]   # the extension swaps the engine before it starts

``install`` runs when the app is built, before the service starts its engine.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter

from services.rollout.engines import engine_class
from services.rollout.engines.hf.engine import HFEngine
from services.rollout.engines.settings import ENGINES, HFEngineSettings
from services.rollout.engines.types import Finish, SequenceDelta, SequenceRequest

KIND = "sleep"
TOKEN_S_ENV = "FLEETRL_SLEEP_TOKEN_S"
COUNT = re.compile(r"count (\d+)")
DIGITS = "0123456789"


def token_s() -> float:
    return float(os.environ.get(TOKEN_S_ENV, "0.02"))


def answer_length(prompt: str) -> int:
    """Tokens the engine answers ``prompt`` with: the ``N`` of ``count N`` (1 without one)."""
    m = COUNT.search(prompt)
    return int(m.group(1)) if m else 1


class SleepEngine(HFEngine):
    """The hf engine with scripted generation: ``count N`` -> N digit tokens then EOS, ``token_s()`` per token."""

    kind = KIND

    def __init__(self, settings: Any, model_path: str) -> None:
        super().__init__(settings, model_path)
        self.token_s = token_s()
        self._stop_now: dict[str, asyncio.Event] = {}

    async def _stream(self, request: SequenceRequest) -> AsyncIterator[SequenceDelta]:
        stop = self._stop_now.setdefault(request.rid, asyncio.Event())
        try:
            prompt = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=True)
            want = answer_length(prompt)
            digit_ids = self.tokenizer.convert_tokens_to_ids(list(DIGITS))
            eos = self.tokenizer.eos_token_id
            logprob = -math.log(max(2, len(self.tokenizer)))
            p = request.params
            for i in range(p.max_new_tokens):
                try:  # the sleep is the token's generation time; an abort ends it at once
                    await asyncio.wait_for(stop.wait(), self.token_s)
                    yield SequenceDelta([], [], "", Finish("abort"))
                    return
                except asyncio.TimeoutError:
                    pass
                tok = digit_ids[i % len(DIGITS)] if i < want or eos is None or p.ignore_eos else eos
                finish = None
                if tok == eos and not p.ignore_eos:
                    finish = Finish("stop", matched=tok)
                elif i + 1 >= p.max_new_tokens:
                    finish = Finish("length", length=i + 1)
                text = "" if tok == eos else self.tokenizer.decode([tok])
                yield SequenceDelta([tok], [logprob], text, finish)
                if finish is not None:
                    return
        finally:
            self._stop_now.pop(request.rid, None)

    async def abort(self, rid: str) -> None:
        ev = self._stop_now.get(rid)
        if ev is not None:
            ev.set()
        await super().abort(rid)

    async def _abort_all(self) -> None:
        for ev in list(self._stop_now.values()):
            ev.set()
        await super()._abort_all()


class SleepEngineSettings(HFEngineSettings):
    """The hf engine's settings under the kind ``sleep`` (the extension builds the engine from the hf section)."""

    kind: Literal["sleep"] = "sleep"  # type: ignore[assignment]


def install(service: Any) -> APIRouter:
    """The rollout extension: register the ``sleep`` kind and give the service a :class:`SleepEngine` in place of
    the engine its settings built (it has not started yet). ``GET /sleep_engine`` says what it runs."""
    ENGINES.register(KIND, SleepEngineSettings, SleepEngine, replace=True)
    service.engine = engine_class(KIND)(service.settings.engine, service.settings.model)
    router = APIRouter()

    @router.get("/sleep_engine")
    async def about() -> dict:
        return {"kind": KIND, "token_s": service.engine.token_s}

    return router
