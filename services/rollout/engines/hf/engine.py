"""The hf engine: a transformers causal LM in this process, decoded by :class:`DecodeLoop`.

``model`` is the torch module itself: the weight-sync sidecar pauses the engine, copies tensors into
``model``'s parameters in place under ``torch.no_grad()``, sets the new ``weight_version`` and resumes.

Prefix cache (``prefix_cache_tokens``, :mod:`~services.rollout.engines.hf.prefix_cache`): the KV of recently
finished sequences, reused by prompts that extend them; emptied whenever the weight version is set and when
generation resumes after a pause, so a prefix computed by other weights is never reused.

Health: liveness (``/health``) never queues behind the backlog. While the decode loop has work, a step
finished within ``health_stall_s`` proves it alive (no probe is queued); only an idle loop runs the
one-token probe. Readiness (``/health_generate``) always runs the probe through the queue.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

import torch

from services.rollout.engines.base import Engine, EnginePaused, EngineUnavailable
from services.rollout.engines.hf.grammar import Grammars
from services.rollout.engines.hf.loop import DecodeLoop, Row
from services.rollout.engines.hf.prefix_cache import PrefixCache
from services.rollout.engines.settings import HFEngineSettings
from services.rollout.engines.types import SamplingParams, SequenceDelta, SequenceRequest

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class HFEngine(Engine):
    kind = "hf"
    honours = frozenset({"min_new_tokens", "stop_regex", "spaces_between_special_tokens", "frequency_penalty",
                         "presence_penalty", "repetition_penalty", "grammar"})
    weight_sink = "services.rollout.weights.sinks.hf:HFSink"  # receives the buckets itself, swaps them in
    scores_prompts = True
    settings: HFEngineSettings

    def __init__(self, settings: HFEngineSettings, model_path: str) -> None:
        super().__init__(settings, model_path)
        self.model: Any = None
        self.device = _resolve_device(settings.device)
        self._decode: DecodeLoop | None = None
        self._queues: dict[str, asyncio.Queue[SequenceDelta]] = {}
        self._aloop: asyncio.AbstractEventLoop | None = None
        self.prefix_cache = PrefixCache(settings.prefix_cache_tokens)
        self._grammars: Grammars | None = None
        self._scoring = asyncio.Lock()  # one prompt-logprob forward at a time, beside the decode loop

    async def _start(self) -> None:
        if self.settings.torch_threads:
            torch.set_num_threads(self.settings.torch_threads)
        self.model = await asyncio.to_thread(self._load_model)
        self._aloop = asyncio.get_running_loop()
        self._decode = DecodeLoop(
            self.model, self.tokenizer, self.device,
            max_batch_size=self.settings.max_batch_size,
            max_wait_s=self.settings.max_wait_ms / 1000.0,
            stop_regex_bounds=(self.settings.stop_regex_window_chars, self.settings.stop_regex_timeout_s),
            context_length=self.context_length,
            eos_ids=self._eos_ids(),
            deliver=self._deliver_threadsafe,
            on_step=self._observe_step,
            prefix_cache=self.prefix_cache,
        )
        self._grammars = Grammars(self.tokenizer, self._decode.vocab_size, self._decode.eos_ids,
                                  self.settings.max_grammar_chars, self.settings.grammar_compile_timeout_s)
        self._decode.start()
        log.info("hf engine: %s on %s (%s), context %d", self.model_path, self.device,
                 next(self.model.parameters()).dtype, self.context_length)
        log.info("torch threads: %d intra-op, %d inter-op, on %d cores", torch.get_num_threads(),
                 torch.get_num_interop_threads(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())

    def _load_model(self):
        from transformers import AutoModelForCausalLM

        dtype = _DTYPES.get(self.settings.dtype) or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        if self.device.type == "cuda" and self.settings.gpu_memory_fraction is not None:
            # a budget on this GPU shared with the learner: allocations past it fail here, not in the learner
            torch.cuda.set_per_process_memory_fraction(self.settings.gpu_memory_fraction, self.device)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        return model.to(self.device).eval()  # type: ignore[arg-type]  # transformers' stub: .to wrapped without device

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(int(i) for i in gen_eos)
        return frozenset(ids)

    async def prompt_logprobs(self, prompt_ids: list[int], start: int,
                              admit_timeout: float | None = None) -> list[float | None]:
        """One forward of the prompt on the engine's model, in a worker thread beside the decode loop (one at a
        time). Weights change only while paused and each switch sets a version: a result computed across a switch
        is computed again (at most 3 tries, then 503)."""
        for _ in range(3):
            await self._admit(admit_timeout)
            version = self.weight_version
            async with self._scoring:
                lps = await asyncio.to_thread(_prompt_logprobs, self.model, prompt_ids, self.device)
            if not self.paused and self.weight_version == version:
                return lps[start:]
        raise EnginePaused("the weights changed during every try at the prompt logprobs")

    # ---- weights: the prefix cache holds KV of the weights that computed it ------------------------------
    def set_weight_version(self, v: int) -> None:
        super().set_weight_version(v)
        self.prefix_cache.invalidate()

    async def between_steps(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` (short, blocking; in a worker thread) while no forward of this engine runs: between two decode
        steps, and no prompt-logprob forward. For a change of the weights that keeps the version and the function
        (an adapter version's merge swapped in for its hooks); a switch to another version pauses instead."""
        async with self._scoring:
            if self._decode is None:
                return fn()
            return await asyncio.to_thread(self._decode.between_steps, fn)

    async def _on_resume(self) -> None:
        # weights change only while generation is paused (the sidecar pauses around every switch, and a
        # caller writing into ``model`` must too): whatever was cached before may be stale now
        self.prefix_cache.invalidate()

    async def _stop(self) -> None:
        if self._decode is not None:
            await asyncio.to_thread(self._decode.stop)

    def _observe_step(self, size: int) -> None:
        if self.on_batch_step is not None:
            self.on_batch_step(size)

    # ---- thread -> event loop ----------------------------------------------------------------------
    def _deliver_threadsafe(self, items: list[tuple[Row, SequenceDelta]]) -> None:
        if self._aloop is not None and not self._aloop.is_closed():
            self._aloop.call_soon_threadsafe(self._deliver, items)

    def _deliver(self, items: list[tuple[Row, SequenceDelta]]) -> None:
        for row, delta in items:
            q = self._queues.get(row.req.rid)
            if q is not None:
                q.put_nowait(delta)

    # ---- Engine ------------------------------------------------------------------------------------
    async def _stream(self, request: SequenceRequest) -> AsyncGenerator[SequenceDelta, None]:
        if request.rid in self._queues:
            raise ValueError(f"request id {request.rid!r} is already in flight")
        if self._decode is None or self._grammars is None:
            raise EngineUnavailable("the hf engine is not started")
        grammar = None
        if request.params.grammar is not None:  # compiled in a worker thread, bounded (engines/hf/grammar.py)
            resumed = request.prompt_ids[len(request.prompt_ids) - request.resumed:] if request.resumed else ()
            grammar = await self._grammars.matcher(request.params.grammar, resumed)
        q: asyncio.Queue[SequenceDelta] = asyncio.Queue()
        self._queues[request.rid] = q
        finished = False
        try:
            self._decode.submit(request, grammar)
            while True:
                delta = await q.get()
                finished = delta.finish is not None
                yield delta
                if finished:
                    return
        finally:
            self._queues.pop(request.rid, None)
            if not finished and self._decode is not None:
                self._decode.abort(request.rid, "the client went away")

    async def abort(self, rid: str) -> None:
        if self._decode is not None:
            self._decode.abort(rid, "aborted by request")

    async def _abort_all(self) -> None:
        if self._decode is not None:
            self._decode.abort_all("aborted: generation paused")

    @property
    def queue_depth(self) -> int:
        return self._decode.queue_depth if self._decode is not None else 0

    async def _alive(self) -> bool:
        loop = self._decode
        if loop is None or not loop.alive:
            return False
        if loop.busy:
            stalled = loop.stalled_s()
            if stalled > self.settings.health_stall_s:
                log.warning("decode loop has %d running and %d queued sequences but finished no step for %.0fs",
                            loop.running, loop.queue_depth, stalled)
                return False
            return True
        return await self._probe()

    async def _probe(self) -> bool:
        if self._decode is None or not self._decode.alive:
            return False
        if self.paused:  # weights may be mid-update; the loop being alive is what can be checked
            return True
        probe = SequenceRequest(
            rid=f"health-{uuid.uuid4().hex}",
            prompt_ids=(self._probe_token(),),
            params=SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True),
        )
        try:
            out = await self.generate(probe, admit_timeout=0.0)
        except EnginePaused:
            return self._decode.alive
        return len(out.output_ids) == 1 and out.finish is not None and out.finish.type == "length"

    def _probe_token(self) -> int:
        for tid in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id, 0):
            if tid is not None:
                return int(tid)
        return 0


def _prompt_logprobs(model: Any, ids: list[int], device: torch.device) -> list[float | None]:
    """``[None, lp(t1 | t0), lp(t2 | t0 t1), ...]``: the model's log-softmax (no sampling transforms)."""
    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=device)
        logits = model(input_ids=x, use_cache=False).logits[0, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, x[0, 1:].unsqueeze(-1)).squeeze(-1)
    return [None, *lp.tolist()]
