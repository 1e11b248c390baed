"""The engine seam: one abstract :class:`Engine`, and engines by kind ("hf", "sglang", "vllm") through the
engine plug-in point (``services.rollout.engines.settings.ENGINES``): each kind's settings model and class (an
import path, loaded with the service kit's loader and checked to be an :class:`Engine` subclass).

What every engine offers (the routes, the rollout worker and the weight-sync sidecar use only this):

- lifecycle: ``await start()``, ``await stop()``; ``await health() -> bool`` is liveness (bounded by
  ``health_timeout_s``, never queued behind the engine's backlog: an engine with work proves itself alive by
  recent progress, an idle one by a real probe); ``await health_generate() -> bool`` is readiness (always a
  real one-token generation through the queue, bounded by the same timeout).
- generation: ``stream(request)`` yields :class:`SequenceDelta` s, ``generate(request)`` returns a
  :class:`SequenceOutput`, ``generate_many(requests)`` runs several concurrently (the engine batches
  them), ``abort(rid)`` ends one in flight with ``finish_reason = abort``. Batching, ``n``, stop
  strings / ids, seeds, logprobs are carried per sequence by :class:`SequenceRequest`. A sequence the
  engine cannot run as asked (parameters out of what it can hold) raises :class:`SequenceRejected` for
  that request alone; a failure that belongs to one sequence ends that sequence alone.
- weights: ``weight_version`` (int) and ``set_weight_version(v)``; whether and how the engine loads the
  versions the learner publishes is its class's ``weight_sink`` (the import path of its weight sink, or
  None: it cannot), so an engine and its sink are declared in one place. For the hf engine ``model`` (the
  torch ``nn.Module``; copy weights in place under ``torch.no_grad()`` while paused) and
  ``tokenizer``; for SGLang / vLLM ``base_url`` and ``client`` (the shared ``httpx.AsyncClient``) so
  the sidecar can call the engine server's own weight-update endpoints.
- pause: ``await pause(mode)`` stops admitting new sequences (they wait until ``resume()``, bounded by
  their admission timeout, then fail with :class:`EnginePaused`); ``mode="wait"`` returns once the
  sequences in flight have finished, ``mode="abort"`` aborts them (``finish_reason = abort``) and
  returns once they are gone, ``mode="partial"`` interrupts them at a token boundary like abort, but each
  one continues after ``resume()`` from its exact tokens under the new weights (its prompt plus what it had
  generated is prefilled again, so no forward pass mixes two versions), and its deltas say which weight
  version produced them (``SequenceOutput.version_spans``). ``paused`` tells the state. ``await resume()``
  admits again.

Every engine also has ``tokenizer`` (a Hugging Face tokenizer loaded from the model directory: the
service tokenises text and applies chat templates itself, so token ids are always FleetRL's) and
``context_length``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from services.rollout.engines.settings import ENGINES, EngineSettingsBase
from services.rollout.engines.types import (
    Finish,
    SamplingParams,
    SequenceDelta,
    SequenceOutput,
    SequenceRequest,
)

log = logging.getLogger(__name__)

PauseMode = Literal["abort", "wait", "partial"]

__all__ = [
    "Engine",
    "EngineError",
    "EnginePaused",
    "EngineUnavailable",
    "Finish",
    "PauseMode",
    "SamplingParams",
    "SequenceDelta",
    "SequenceOutput",
    "SequenceRejected",
    "SequenceRequest",
    "create_engine",
    "engine_class",
    "register_engine",
]


class EngineError(RuntimeError):
    """Base of engine failures the service maps to HTTP statuses."""


class EnginePaused(EngineError):
    """Generation is paused and the request's admission wait ran out (HTTP 503 + Retry-After)."""


class EngineUnavailable(EngineError):
    """The engine cannot serve right now (not started, or its server is unreachable): HTTP 503."""


class SequenceRejected(ValueError):
    """The engine cannot run this sequence as asked (a parameter outside what it can hold): HTTP 400.

    Raised when the sequence is submitted, for its request alone; nothing else in the engine is affected.
    Not an :class:`EngineError`: retrying the same sequence can never succeed.
    """


class Engine(ABC):
    """Abstract generation engine. Subclasses implement ``_start``, ``_stop``, ``_probe``, ``_stream``,
    ``abort`` and ``_abort_all``; admission, pause / resume and in-flight tracking live here."""

    kind: ClassVar[str]
    #: How this engine loads the weights the learner publishes: the import path (``"package.module:Class"``)
    #: of its weight sink, a ``services.rollout.weights.sinks.WeightSink`` (imported only when a weight
    #: sidecar starts beside the engine); None: the engine cannot load weights, and no sidecar runs with it.
    weight_sink: ClassVar[str | None] = None
    #: The optional sampling features (:data:`~services.rollout.engines.types.FEATURES`) this engine applies; a
    #: sequence asking for another is refused (HTTP 400 naming the field and this engine's ``kind``).
    honours: ClassVar[frozenset[str]] = frozenset()
    #: The engine gives the logprobs of prompt tokens (:meth:`prompt_logprobs`; SGLang's ``logprob_start_len``).
    scores_prompts: ClassVar[bool] = False

    def __init__(self, settings: EngineSettingsBase, model_path: str) -> None:
        self.settings = settings
        self.model_path = model_path
        self.tokenizer: Any = None
        self.context_length: int = settings.context_length or 0
        self._weight_version = 0
        self._paused = False
        self._admitting = asyncio.Event()
        self._admitting.set()
        self._inflight: set[str] = set()
        self._interrupted: set[str] = set()  # in flight when a partial pause came: they continue after resume
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = False
        #: called with the size of each decode step's batch by engines that batch in this process (hf);
        #: may be called from the engine's own thread
        self.on_batch_step: Callable[[int], None] | None = None

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the tokenizer, then the engine itself (model weights or a connection to its server)."""
        self.tokenizer = await asyncio.to_thread(self._load_tokenizer)
        if not self.context_length:
            self.context_length = self._read_context_length()
        await self._start()
        self._started = True

    async def stop(self) -> None:
        """Abort what is in flight and release the engine."""
        if self._inflight:
            try:
                await self._abort_all()
            except Exception as exc:  # noqa: BLE001 - stopping must not fail because the engine already went away
                log.warning("aborting in-flight sequences on stop failed: %s", exc)
        self._started = False
        await self._stop()

    async def health(self) -> bool:
        """Liveness: True while the engine works (bounded by ``health_timeout_s``). Its answer never depends
        on how much work is queued: see :meth:`_alive`."""
        return await self._bounded(self._alive, "liveness check")

    async def health_generate(self) -> bool:
        """Readiness: True when a real one-token generation, queued like any request, finishes within
        ``health_timeout_s``; so False on an engine too saturated to serve a new request in that time."""
        return await self._bounded(self._probe, "generation probe")

    async def _bounded(self, check: Callable[[], Any], what: str) -> bool:
        if not self._started:
            return False
        try:
            return bool(await asyncio.wait_for(check(), self.settings.health_timeout_s))
        except Exception as exc:  # noqa: BLE001 - any failure of the check means "cannot generate"
            log.warning("%s failed: %r", what, exc)
            return False

    # ---- generation ---------------------------------------------------------------------------------
    async def stream(self, request: SequenceRequest, admit_timeout: float | None = None) -> AsyncGenerator[SequenceDelta, None]:
        """Deltas of one sequence. Waits for admission while paused (at most ``admit_timeout`` s).

        Use it under ``contextlib.aclosing``: closing it early aborts the sequence and frees its slot.
        """
        if not self._started:
            raise EngineUnavailable("the engine is not started")
        await self._admit(admit_timeout)
        segment: SequenceRequest | None = request
        produced: list[int] = []
        while segment is not None:
            version = self._weight_version  # constant while it runs: weights switch only with nothing in flight
            interrupted: SequenceDelta | None = None
            self._inflight.add(request.rid)
            self._idle.clear()
            try:
                async with aclosing(self._stream(segment)) as deltas:
                    async for delta in deltas:
                        delta.weight_version = version
                        produced += delta.token_ids
                        if delta.finish is not None and delta.finish.type == "abort" and request.rid in self._interrupted:
                            interrupted = delta
                            break
                        yield delta
            finally:
                self._interrupted.discard(request.rid)
                self._inflight.discard(request.rid)
                if not self._inflight:
                    self._idle.set()
            if interrupted is None:
                return
            interrupted.finish = None  # what it had generated goes out; the sequence goes on
            yield interrupted
            segment = self._continuation(request, produced)
            if segment is None:
                yield SequenceDelta([], [], "", Finish("length", length=len(produced)), weight_version=version)
                return
            await self._admit(admit_timeout)

    def _continuation(self, request: SequenceRequest, produced: list[int]) -> SequenceRequest | None:
        """The rest of an interrupted sequence: its prompt plus the tokens it produced, for the tokens it has
        left (None when it has none left: it ends with ``length``)."""
        left = request.params.max_new_tokens - len(produced)
        prompt = request.prompt_ids + tuple(produced)
        if left <= 0 or len(prompt) >= self.context_length:
            return None
        params = replace(request.params, max_new_tokens=left,
                         min_new_tokens=max(0, request.params.min_new_tokens - len(produced)))
        return replace(request, prompt_ids=prompt, params=params, resumed=len(produced))

    async def generate(self, request: SequenceRequest, admit_timeout: float | None = None) -> SequenceOutput:
        """One finished sequence."""
        out = SequenceOutput(rid=request.rid, prompt_ids=request.prompt_ids)
        async with aclosing(self.stream(request, admit_timeout)) as deltas:
            async for delta in deltas:
                out.add(delta)
        return out.settle(self._weight_version)

    async def generate_many(
        self, requests: Sequence[SequenceRequest], admit_timeout: float | None = None
    ) -> list[SequenceOutput]:
        """Several sequences at once (the engine batches them); order follows ``requests``.

        If one fails the others are cancelled (and so aborted) before the error propagates.
        """
        if len(requests) == 1:  # a multi-turn rollout's every turn: no task and gather of its own
            return [await self.generate(requests[0], admit_timeout)]
        tasks = [asyncio.ensure_future(self.generate(r, admit_timeout)) for r in requests]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def prompt_logprobs(self, prompt_ids: list[int], start: int,
                              admit_timeout: float | None = None) -> list[float | None]:
        """The logprob of each prompt token from position ``start`` on, under the served weights: ``lp(t_i | t_<i)``,
        None for position 0 (no context), as SGLang's ``input_token_logprobs``. Engines with ``scores_prompts``."""
        raise SequenceRejected(f"logprob_start_len: the `{self.kind}` engine serving this model gives no prompt "
                               "logprobs (leave it at -1)")

    @abstractmethod
    async def abort(self, rid: str) -> None:
        """End sequence ``rid`` if it is in flight: its last delta carries ``finish_reason = abort``."""

    # ---- weights -----------------------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        """Version of the weights the engine generates with (0 = the initial checkpoint)."""
        return self._weight_version

    def set_weight_version(self, v: int) -> None:
        if v < 0:
            raise ValueError(f"weight version must be >= 0, got {v}")
        self._weight_version = int(v)

    # ---- pause / resume ----------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def inflight(self) -> int:
        """Sequences admitted and not yet finished."""
        return len(self._inflight)

    @property
    def queue_depth(self) -> int:
        """Sequences admitted but still waiting for a batch slot (engines whose server queues say 0)."""
        return 0

    async def pause(self, mode: PauseMode = "wait", timeout: float | None = None) -> None:
        """Stop admitting; ``wait`` lets in-flight sequences finish, ``abort`` aborts them, ``partial``
        interrupts them to continue after ``resume()``. Returns when nothing is in flight
        (``asyncio.TimeoutError`` after ``timeout`` s; the engine stays paused)."""
        if mode not in ("abort", "wait", "partial"):
            raise ValueError(f"pause mode must be 'abort', 'wait' or 'partial', got {mode!r}")
        self._paused = True
        self._admitting.clear()
        if mode == "partial":
            self._interrupted |= self._inflight
        if mode != "wait" and self._inflight:
            await self._abort_all()
        await asyncio.wait_for(self._idle.wait(), timeout)

    async def resume(self) -> None:
        """Admit new sequences again."""
        await self._on_resume()
        self._paused = False
        self._admitting.set()

    async def _admit(self, timeout: float | None) -> None:
        if self._admitting.is_set():
            return
        try:
            await asyncio.wait_for(self._admitting.wait(), timeout)
        except asyncio.TimeoutError:
            raise EnginePaused(f"generation is paused (waited {timeout:.1f}s for it to continue)") from None

    # ---- for subclasses ----------------------------------------------------------------------------
    @abstractmethod
    async def _start(self) -> None: ...

    @abstractmethod
    async def _stop(self) -> None: ...

    @abstractmethod
    async def _probe(self) -> bool:
        """One real check that the engine can generate (called under the health timeout)."""

    async def _alive(self) -> bool:
        """Liveness check (called under the health timeout). Default: :meth:`_probe`. An engine whose probe
        waits behind its own backlog overrides it, so that a busy engine is not reported dead."""
        return await self._probe()

    @abstractmethod
    def _stream(self, request: SequenceRequest) -> AsyncGenerator[SequenceDelta, None]:
        """Generate one admitted sequence. Must abort it at the engine when closed early."""

    @abstractmethod
    async def _abort_all(self) -> None:
        """Abort every sequence in flight."""

    async def _on_resume(self) -> None:
        """Hook run by ``resume`` before admission reopens (remote engines continue their server)."""

    def _load_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_path)

    def _read_context_length(self) -> int:
        cfg = Path(self.model_path) / "config.json"
        if cfg.is_file():
            data = json.loads(cfg.read_text())
            for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
                if isinstance(data.get(key), int):
                    return data[key]
        limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(limit, int) and 0 < limit < 10**7:
            return limit
        raise EngineUnavailable(
            f"cannot tell the context length of {self.model_path}: set engine.context_length in the settings"
        )


# ---- registry (services.rollout.engines.settings.ENGINES) ----------------------------------------------
def register_engine(kind: str, settings: type[BaseModel], cls: str | type[Engine], *, replace: bool = False) -> None:
    """Deprecated: ``ENGINES.register(kind, settings, cls)`` (``services.rollout.engines.settings.ENGINES``) is the
    one way to add an engine kind; this thin alias warns once (DeprecationWarning) and calls it."""
    global _register_engine_warned
    if not _register_engine_warned:
        _register_engine_warned = True
        warnings.warn("register_engine(kind, settings, cls) is deprecated: use "
                      "services.rollout.engines.settings.ENGINES.register(kind, settings, cls)",
                      DeprecationWarning, stacklevel=2)
    ENGINES.register(kind, settings, cls, replace=replace)


_register_engine_warned = False


def engine_class(kind: str) -> type[Engine]:
    """The engine class registered for ``kind`` (imported on first use, so torch loads only for hf)."""
    if kind not in ENGINES:
        raise KeyError(ENGINES.unknown(kind))
    return ENGINES.load(kind)


def create_engine(settings: EngineSettingsBase, model_path: str) -> Engine:
    """Build (not start) the engine ``settings.kind`` names."""
    return engine_class(settings.kind)(settings, model_path)
