"""The rollout service object: its components (the engine, the weight sidecar, the sessions, the worker), admission
control, tokenisation, metrics.

Routes make one call on it; it turns prompts into engine :class:`SequenceRequest` s, admits them
(bounded: over ``limits.max_inflight_sequences`` it raises :class:`Overloaded` rather than queueing
without bound), runs them on the engine, and records metrics.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from services.rollout import chat_templates
from services.rollout.engines.base import Engine, PauseMode, create_engine
from services.rollout.engines.types import (
    Finish,
    SamplingParams,
    SequenceDelta,
    SequenceOutput,
    SequenceRequest,
)
from services.rollout.errors import Overloaded, RequestError
from services.rollout.metrics import RolloutMetrics
from services.rollout.settings import RolloutSettings
from shared.upstream_fields import describe

if TYPE_CHECKING:
    from services.rollout.sessions.manager import SessionManager
    from services.rollout.weights.sidecar import WeightSidecar
    from services.rollout.worker.loop import RolloutWorker

log = logging.getLogger(__name__)
T = TypeVar("T")


def new_request_id() -> str:
    return uuid.uuid4().hex


class Component(Protocol):
    """A part of the rollout service with a lifetime: the engine, the weight sidecar, the worker."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def _stop_quietly(component: Component) -> None:
    try:
        await component.stop()
    except Exception:
        log.exception("stopping the %s failed", type(component).__name__)


def exit_process() -> None:
    """End this process the way SIGTERM does (the server shuts down, components stop, the sidecar deregisters)."""
    os.kill(os.getpid(), signal.SIGTERM)


class RolloutService:
    def __init__(self, settings: RolloutSettings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.engine = engine or create_engine(settings.engine, settings.model)
        self.metrics = RolloutMetrics()
        self.started_at = int(time.time())
        self._admitted = 0
        self.weight_sidecar: WeightSidecar | None = None
        self.worker: RolloutWorker | None = None
        self.sessions: SessionManager | None = None
        self._running: list[Component] = []
        self._drain_task: asyncio.Task | None = None
        self.on_drained: Callable[[], None] | None = None  # the CLI's: end the process once drained
        self._tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-tokenize")

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the components in order, each once the one before it is up: the engine, the weight sidecar
        (``settings.sidecar_on``; it loads the latest weights before the worker generates), the worker
        (``worker.enabled``). If one fails to start, those already running are stopped, then it raises."""
        try:
            await self._start(self.engine)
            self.engine.on_batch_step = self.metrics.batch_size.observe
            self.metrics.bind(
                queue_depth=lambda: self.engine.queue_depth,
                inflight=lambda: self.engine.inflight,
                weight_version=lambda: self.engine.weight_version,
                paused=lambda: float(self.engine.paused),
            )
            cache = getattr(self.engine, "prefix_cache", None)
            if cache is not None:
                self.metrics.bind_prefix_cache(lambda: cache.stats, lambda: (len(cache), cache.tokens))
            if self.settings.sidecar_on:
                from services.rollout.weights.sidecar import create_sidecar

                self.weight_sidecar = create_sidecar(self.engine, self.settings)
                if self.weight_sidecar is not None:
                    await self._start(self.weight_sidecar)
            if self.settings.sessions.enabled:
                from services.rollout.sessions.manager import SessionManager
                from shared.advertise import default_url

                s = self.settings
                self.sessions = SessionManager(
                    s.sessions, redis_url=s.redis_url, run_name=s.run_name, reward_url=s.worker.reward_url,
                    tokenizer=self.tokenizer, registry=self.metrics.registry,
                    url=s.advertise_url or default_url(s.host, s.port), host=s.host,
                    control_token=s.control_token.get_secret_value() if s.control_token else None,
                    run_key=s.run_key, max_experience_backlog=s.run.max_experience_backlog,
                    reward_token=s.worker.reward_token.get_secret_value() if s.worker.reward_token else None)
                await self._start(self.sessions)
            if self.settings.worker.enabled:
                from services.rollout.worker.loop import RolloutWorker
                from services.rollout.worker.settings import WorkerRun

                s = self.settings
                run = WorkerRun(redis_url=s.redis_url, run_name=s.run_name, run_key=s.run_key, worker=s.worker, run=s.run)
                self.worker = RolloutWorker(run, self, self.metrics.registry)
                await self._start(self.worker)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, component: Component) -> None:
        try:
            await component.start()
        except BaseException:
            await _stop_quietly(component)  # release what it opened before it failed
            raise
        self._running.append(component)

    async def stop(self) -> None:
        """Stop the running components in reverse order (worker, sidecar, engine); one failing to stop is
        logged and the others still stop."""
        while self._running:
            await _stop_quietly(self._running.pop())
        self._tokenizing.shutdown(wait=False, cancel_futures=True)
        self._tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-tokenize")  # lazy: no thread yet

    async def health(self) -> bool:
        return await self.engine.health()

    async def health_generate(self) -> bool:
        return await self.engine.health_generate()

    # ---- leaving the pool ---------------------------------------------------------------------------
    def drain(self, timeout_s: float | None = None) -> None:
        """Leave the pool (``POST /drain``): the worker drains (``RolloutWorker.drain``), then the process exits
        through its ordinary shutdown (SIGTERM to itself), where the weight sidecar deregisters. Idempotent."""
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(timeout_s), name="drain")

    async def _drain(self, timeout_s: float | None) -> None:
        try:
            if self.worker is not None:
                await self.worker.drain(timeout_s)
        finally:
            if self.on_drained is not None:
                log.info("drained; exiting")
                self.on_drained()
            else:
                log.info("drained (embedded: the process that runs this app decides when it ends)")

    def drain_state(self) -> dict[str, Any]:
        done = self._drain_task is not None and self._drain_task.done()
        counts = self.worker.drained if self.worker is not None and self.worker.drained else {}
        return {"draining": self._drain_task is not None or bool(self.worker and self.worker.draining),
                "done": done, **counts}

    async def pause(self, mode: PauseMode, timeout: float | None = None) -> None:
        await self.engine.pause(mode, timeout)

    async def resume(self) -> None:
        await self.engine.resume()

    # ---- what the worker uses of it (services.rollout.worker.loop.WorkerReplica) -----------------------
    @property
    def model_name(self) -> str:
        return self.settings.model_name

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def check_sequence(self, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """A sequence the worker asks for, bounded as a request's (its prompt, stop ids and stop strings); the
        ``max_new_tokens`` to generate."""
        max_new = self.check_prompt(prompt_ids, params.max_new_tokens)
        self.check_stop_ids(params.stop_token_ids)
        self.check_stops(params.stop)
        return max_new

    # ---- tokens ------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        if not ids:
            raise RequestError("the prompt tokenises to nothing")
        return list(ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                            continue_final_message: bool = False, tools: list[dict] | None = None,
                            extra: dict[str, Any] | None = None) -> list[int]:
        """The prompt ids of ``messages`` (blocking: routes call :meth:`chat_prompt`). ``extra``: the request's
        template kwargs, checked first (:meth:`check_template_kwargs`)."""
        if not getattr(self.tokenizer, "chat_template", None) and not (extra and chat_templates.TEMPLATE_KEY in extra):
            raise RequestError(f"the model {self.settings.model_name} has no chat template; use /v1/completions")
        own = self.check_template_kwargs(extra)

        def render() -> str:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tools=tools, **(extra or {}))

        try:
            text = chat_templates.within(self.limits.chat_template_timeout_s, render) if own else render()
        except RequestError:
            raise
        except Exception as exc:  # template errors come from user-supplied messages / kwargs
            raise RequestError(f"the chat template could not render these messages: {exc}") from exc
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise RequestError("the chat prompt tokenises to nothing")
        return list(ids)

    def check_template_kwargs(self, extra: dict[str, Any] | None) -> bool:
        """Refuse (400) template kwargs a request may not send; True when they carry the request's own template."""
        return chat_templates.check_template_kwargs(extra, trusted=self.settings.trust_request_chat_template,
                                                    max_chars=self.limits.max_chat_template_chars)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the service's tokenizer thread: template rendering and tokenising never run on the
        event loop (``/health`` and other requests keep answering), one at a time (tokenizers are not
        thread-safe)."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, fn, *args)

    async def encode_all(self, texts: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Prompts given as text tokenised (off the event loop), prompts given as ids as they are."""
        self.check_batch(len(texts))  # before tokenising any of them
        given = [t for t in texts if not isinstance(t, str)]
        if len(given) == len(texts):
            return [list(t) for t in given]
        return await self.off_loop(lambda: [self.encode(t) if isinstance(t, str) else list(t) for t in texts])

    async def chat_prompt(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        """:meth:`apply_chat_template` off the event loop (kwargs checked on it first: a refusal costs nothing)."""
        self.check_template_kwargs(kwargs.get("extra"))
        return await self.off_loop(lambda: self.apply_chat_template(messages, **kwargs))

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def check_prompt(self, ids: Sequence[int], max_new_tokens: int | None, what: str = "prompt") -> int:
        """Validate a prompt against the vocabulary and context; returns the max_new_tokens to use."""
        if not ids:
            raise RequestError(f"{what} is empty")
        vocab = self.vocab_size
        if max(ids) >= vocab:  # at C speed: a multi-turn prompt is the whole context, every turn
            bad = next(t for t in ids if t >= vocab)
            raise RequestError(f"{what} holds token id {bad}, outside the vocabulary (size {vocab})")
        ctx = self.engine.context_length
        room = ctx - len(ids)
        if room < 1:
            raise RequestError(f"{what} has {len(ids)} tokens; the context length is {ctx}, leaving no room to generate")
        if max_new_tokens is None:
            return room
        if max_new_tokens > room:
            raise RequestError(
                f"{what} ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the context length {ctx}; "
                f"ask for at most {room} new tokens"
            )
        return max_new_tokens

    def check_stop_ids(self, ids: Sequence[int] | None) -> None:
        limit = self.limits.max_stop_token_ids
        if ids and len(ids) > limit:
            raise RequestError(f"{len(ids)} stop_token_ids; this server takes at most {limit} "
                               "(limits.max_stop_token_ids)")
        bad = next((t for t in ids or () if t >= self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"stop_token_ids holds {bad}, outside the vocabulary (size {self.vocab_size})")

    def check_batch(self, prompts: int) -> None:
        if prompts > self.limits.max_prompts_per_request:
            raise RequestError(f"{prompts} prompts in one request; the limit is "
                               f"{self.limits.max_prompts_per_request} (limits.max_prompts_per_request)")

    def check_stops(self, stop: Sequence[str]) -> None:
        """Stop strings within ``limits.max_stop_strings`` and ``limits.max_stop_string_chars`` (each is checked
        on every generated token, on the decode thread every request shares)."""
        limit = self.limits.max_stop_strings
        if len(stop) > limit:
            raise RequestError(f"{len(stop)} stop strings; this server takes at most {limit} (limits.max_stop_strings)")
        chars = self.limits.max_stop_string_chars
        long = next((s for s in stop if len(s) > chars), None)
        if long is not None:
            raise RequestError(f"a stop string of {len(long)} characters; this server takes at most {chars} per "
                               "string (limits.max_stop_string_chars)")

    def check_stop_regex(self, patterns: Sequence[str]) -> None:
        """stop_regex within ``limits.max_stop_regexes`` / ``limits.max_stop_regex_chars`` (searched on every
        generated token on the engine's thread, each search under ``limits.stop_regex_timeout_s``)."""
        if len(patterns) > self.limits.max_stop_regexes:
            raise RequestError(f"{len(patterns)} stop_regex patterns; this server takes at most "
                               f"{self.limits.max_stop_regexes} (limits.max_stop_regexes)")
        long = next((p for p in patterns if len(p) > self.limits.max_stop_regex_chars), None)
        if long is not None:
            raise RequestError(f"a stop_regex of {len(long)} characters; this server takes at most "
                               f"{self.limits.max_stop_regex_chars} (limits.max_stop_regex_chars)")

    def check_features(self, params: SamplingParams) -> None:
        """400 naming each optional sampling feature the request uses that the serving engine cannot apply."""
        missing = [f"{params.grammar.kind} (structured output)" if name == "grammar" and params.grammar else name
                   for name in params.features_used() if name not in self.engine.honours]
        if missing:
            raise RequestError(f"{', '.join(missing)}: the `{self.engine.kind}` engine serving this model cannot "
                               "honour it (leave it out or null)")

    def check_upstream(self, fields: dict[str, Any]) -> None:
        """400 naming the upstream-API fields a request set that no engine here honours (``shared.upstream_fields``)."""
        if fields:
            raise RequestError(f"{describe(fields)}: not supported by the `{self.engine.kind}` engine serving this "
                               "model (leave it out, null, or at its default)")

    # ---- sequences ---------------------------------------------------------------------------------
    def sequences(self, prompts: list[list[int]], params: list[SamplingParams], n: int, stream: bool,
                  request_id: str) -> list[SequenceRequest]:
        """``len(prompts) * n`` sequence requests, prompt-major; sample j of a seeded prompt uses seed + j
        (modulo 2**63, so that every seed stays in the int64 range the engines hold)."""
        self.check_batch(len(prompts))
        if n > self.limits.max_n:
            raise RequestError(f"n={n} is over this server's limit of {self.limits.max_n} (limits.max_n)")
        for p in {id(p): p for p in params}.values():
            self.check_stops(p.stop)
            self.check_stop_regex(p.stop_regex)
            self.check_features(p)
        out = []
        for i, (ids, p) in enumerate(zip(prompts, params)):
            for j in range(n):
                pj = p if p.seed is None or j == 0 else replace(p, seed=(p.seed + j) % 2**63)
                out.append(SequenceRequest(rid=f"{request_id}-{i}-{j}", prompt_ids=tuple(ids), params=pj, stream=stream))
        return out

    @asynccontextmanager
    async def admit(self, count: int):
        limit = self.limits.max_inflight_sequences
        if count > limit:
            self.metrics.rejected.labels("too_large").inc()
            raise RequestError(f"the request asks for {count} sequences; this server admits at most {limit} at once")
        if self._admitted + count > limit:
            self.metrics.rejected.labels("capacity").inc()
            raise Overloaded(f"over capacity: {self._admitted} sequences in flight (limit {limit}); retry later")
        self._admitted += count
        try:
            yield
        finally:
            self._admitted -= count

    def _record(self, seq: SequenceRequest, out: SequenceOutput) -> None:
        self.metrics.prompt_tokens.inc(len(seq.prompt_ids))
        self.metrics.generated_tokens.inc(len(out.output_ids))
        self.metrics.sequences.labels(out.finish.type if out.finish else "none").inc()

    async def generate(self, seqs: list[SequenceRequest]) -> list[SequenceOutput]:
        """Run the sequences to the end (the engine batches them)."""
        async with self.admit(len(seqs)):
            try:
                outs = await self.engine.generate_many(seqs, admit_timeout=self._pause_wait())
            except asyncio.CancelledError:
                self.metrics.sequences.labels("abort").inc(len(seqs))
                raise
        for seq, out in zip(seqs, outs):
            self._record(seq, out)
        return outs

    async def stream(self, seqs: list[SequenceRequest]) -> AsyncGenerator[tuple[int, SequenceDelta], None]:
        """Deltas of all sequences as they come, tagged with the sequence's index.

        Closing the iterator early (client gone) aborts every sequence still running.
        """
        async with self.admit(len(seqs)):
            queue: asyncio.Queue[tuple[int, SequenceDelta | None, BaseException | None]] = asyncio.Queue()
            started = time.monotonic()

            async def pump(i: int, seq: SequenceRequest) -> None:
                out = SequenceOutput(rid=seq.rid, prompt_ids=seq.prompt_ids)
                try:
                    async with aclosing(self.engine.stream(seq, self._pause_wait())) as deltas:
                        async for delta in deltas:
                            if not out.output_ids and delta.token_ids:
                                self.metrics.ttft.observe(time.monotonic() - started)
                            out.add(delta)
                            queue.put_nowait((i, delta, None))
                    self._record(seq, out.settle(self.engine.weight_version))
                except asyncio.CancelledError:
                    if out.finish is None:  # the client went away: the engine aborted it
                        out.finish = Finish("abort", message="client went away")
                        self._record(seq, out)
                    raise
                except Exception as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
                    queue.put_nowait((i, None, exc))

            tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(seqs)]
            remaining = len(seqs)
            try:
                while remaining:
                    i, delta, exc = await queue.get()
                    if exc is not None:
                        raise exc
                    assert delta is not None
                    if delta.finish is not None:
                        remaining -= 1
                    yield i, delta
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _pause_wait(self) -> float:
        return self.limits.pause_wait_s
