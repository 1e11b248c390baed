"""The hf engine's decode loop: one dedicated thread, continuous batching over a KV cache.

Sequences wait in a queue; the loop admits up to ``max_batch_size`` of them into the running batch at
every step boundary (prefill of the newcomers, merged into the cache), steps all rows together,
samples per row (own temperature / top-k / top-p / seed), and retires rows as they finish (stop token,
stop string, length, abort) — so a long sequence never holds a short one back. With a prefix cache, a
finished row's KV is kept (:mod:`~services.rollout.engines.hf.prefix_cache`) and a newcomer whose prompt
starts with a kept sequence prefills only the rest of its prompt. When the loop is
idle, the first arrival waits for company as long as more keep arriving within ``max_wait`` of each
other (at most ``8 x max_wait``), so a burst of clients starts as one batch. While rows run, newcomers join
once the oldest of them has waited ``max_wait`` (or they would fill the batch), so newcomers that trickle in
(the next turns of multi-turn rollouts) share prefill passes instead of paying one each.

Results go back to the asyncio side through ``deliver`` (called from this thread with a list of
``(row, delta)`` pairs; the engine hops them onto the event loop).

One request never harms another: a sequence's parameters are checked and its seeded generator is made
when it is submitted (:class:`SequenceRejected` for that request alone), and a failure that belongs to
one row (its prefill, its sampling, its text) ends that row alone, with ``finish_reason = abort``. Only a
failed forward step of the running batch, which no row can be blamed for, ends the rows in it.

``progress_at`` is the time of the last finished step (or of the first arrival at an idle loop): a loop
with work and an old ``progress_at`` is stuck, whatever the length of its queue (``/health``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import regex
import torch

from services.rollout.engines.base import SequenceRejected
from services.rollout.engines.hf.batch import KVBatch
from services.rollout.engines.hf.grammar import RowGrammar
from services.rollout.engines.hf.prefix_cache import PrefixCache, PrefixHit
from services.rollout.engines.hf.sampling import (
    Penalties,
    RowParams,
    RowSampling,
    penalised,
    row_generator,
    row_params,
    sample,
)
from services.rollout.engines.hf.text import IncrementalText, StopRegex
from services.rollout.engines.types import Finish, SequenceDelta, SequenceRequest

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Row:
    """One sequence in the loop."""

    req: SequenceRequest
    stop_ids: frozenset[int]
    text: IncrementalText | None
    generator: torch.Generator | None
    sampling: RowParams
    penalties: Penalties | None = None
    grammar: RowGrammar | None = None  # structured output: which tokens may come next
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    aborted: str | None = None  # abort message once aborted
    done: bool = False
    failed: bool = False  # ended by an engine error: its KV is not kept
    epoch: int = -1  # the prefix cache's epoch when it was admitted (its KV is kept only in the same one)
    queued_at: float = 0.0  # when it was submitted (monotonic)


Deliver = Callable[[list[tuple[Row, SequenceDelta]]], None]


class DecodeLoop:
    def __init__(self, model, tokenizer, device: torch.device, *, max_batch_size: int, max_wait_s: float,
                 context_length: int, eos_ids: frozenset[int], deliver: Deliver,
                 stop_regex_bounds: tuple[int, float] = (1024, 0.005),
                 on_step: Callable[[int], None] | None = None, prefix_cache: PrefixCache | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.stop_regex_bounds = stop_regex_bounds  # (window chars, timeout s) of one stop_regex search
        self.context_length = context_length
        self.eos_ids = eos_ids
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (min(eos_ids) if eos_ids else 0)
        self._deliver = deliver
        self._on_step = on_step
        self.prefix_cache = prefix_cache
        self._cond = threading.Condition()
        self._step = threading.Lock()  # held through each step's forwards: between_steps() waits for it
        self._callers = 0  # between_steps() calls waiting for the lock: the loop lets them in before its next step
        self._pending: deque[Row] = deque()
        self._active: list[Row] = []
        self._rows: dict[str, Row] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._shared_gen = torch.Generator(device=device)
        self._shared_gen.seed()
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.vocab_size = int(getattr(embeddings, "num_embeddings", 0) or model.config.vocab_size)
        self.steps = 0
        self.progress_at = time.monotonic()

    # ---- called from the event loop ----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hf-decode-loop", daemon=True)
        self._thread.start()

    def between_steps(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` (short; blocking) while no step of this loop runs: after the step under way ends and before
        the next one starts (what a weight swap that keeps the version needs: every forward sees one state). The
        loop waits for it before its next step (a lock alone is not fair: the loop would take it back at once)."""
        with self._cond:
            self._callers += 1
        try:
            with self._step:
                return fn()
        finally:
            with self._cond:
                self._callers -= 1
                self._cond.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def running(self) -> int:
        return len(self._active)

    @property
    def busy(self) -> bool:
        """Sequences are queued, being admitted or running (submitted and not yet finished)."""
        return bool(self._rows)

    def stalled_s(self) -> float:
        """Seconds the loop has had work without finishing a step (0 while idle)."""
        return time.monotonic() - self.progress_at if self.busy else 0.0

    def submit(self, req: SequenceRequest, grammar: RowGrammar | None = None) -> Row:
        """Queue a sequence (with its structured-output matcher, compiled beforehand). :class:`SequenceRejected`
        when its parameters are out of what the engine holds."""
        row = self._row(req)
        row.grammar = grammar
        with self._cond:
            if self._stopping:
                raise RuntimeError("the decode loop is stopped")
            if not self.busy:
                self.progress_at = time.monotonic()  # idle until now: the wait for this one starts here
            row.queued_at = time.monotonic()
            self._rows[req.rid] = row
            self._pending.append(row)
            self._cond.notify_all()
        return row

    def _row(self, req: SequenceRequest) -> Row:
        p = req.params
        try:
            ids = req.prompt_ids
            if not ids:
                raise ValueError("the prompt is empty")
            if set(map(type, ids)) == {int} and 0 <= min(ids) and max(ids) < self.vocab_size:
                bad = None  # the common case, checked at C speed (a turn's prompt is its whole context)
            else:
                bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise ValueError(f"the prompt holds token id {bad!r}, outside the model's vocabulary (0..{self.vocab_size - 1})")
            if len(ids) >= self.context_length:
                raise ValueError(f"the prompt has {len(ids)} tokens; the context length is {self.context_length}")
            if isinstance(p.max_new_tokens, bool) or not isinstance(p.max_new_tokens, int) or p.max_new_tokens < 1:
                raise ValueError(f"max_new_tokens={p.max_new_tokens!r} must be an integer >= 1")
            if isinstance(p.top_logprobs, bool) or not isinstance(p.top_logprobs, int) or p.top_logprobs < 0:
                raise ValueError(f"top_logprobs={p.top_logprobs!r} must be an integer >= 0")
            sampling = row_params(p.temperature, p.top_k, p.top_p, p.min_p, self.vocab_size)
            gen = row_generator(p.seed, self.device) if p.seed is not None else None
            stops = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos_ids)
            if isinstance(p.min_new_tokens, bool) or not isinstance(p.min_new_tokens, int) or p.min_new_tokens < 0:
                raise ValueError(f"min_new_tokens={p.min_new_tokens!r} must be an integer >= 0")
            own = len(ids) - req.resumed  # a continuation's earlier output counts as output for the penalties
            penalties = Penalties.of(p.frequency_penalty, p.presence_penalty, p.repetition_penalty, ids[:own],
                                     self.vocab_size, self.device)
            if penalties is not None:
                for t in ids[own:]:
                    penalties.add(t)
            window, timeout = self.stop_regex_bounds
            stop_regex = StopRegex.of(p.stop_regex, window, timeout)
            # incremental text only where it is needed during decoding (stop strings / regex, streaming)
            text = (IncrementalText(self.tokenizer, p.skip_special_tokens, p.stop, p.no_stop_trim, stop_regex,
                                    p.spaces_between_special_tokens)
                    if p.stop or stop_regex or req.stream else None)
        except (ValueError, TypeError, OverflowError, regex.error) as exc:
            raise SequenceRejected(f"the engine cannot run this sequence: {exc}") from exc
        return Row(req=req, stop_ids=stops, text=text, generator=gen, sampling=sampling, penalties=penalties,
                   top=[] if p.top_logprobs else None)

    def abort(self, rid: str, message: str = "aborted") -> None:
        with self._cond:
            row = self._rows.get(rid)
            if row is not None and row.aborted is None:
                row.aborted = message
                self._cond.notify_all()

    def abort_all(self, message: str) -> None:
        with self._cond:
            for row in self._rows.values():
                if row.aborted is None:
                    row.aborted = message
            self._cond.notify_all()

    # ---- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        batch = KVBatch(self.model)
        with torch.inference_mode():
            while True:
                joining = self._next_admissions()
                if joining is None:
                    break
                with self._cond:  # a between_steps() caller goes first
                    while self._callers and not self._stopping:
                        self._cond.wait(0.05)
                try:
                    with self._step:
                        self._iteration(batch, joining)
                except Exception as exc:  # an engine failure ends the batch, never the loop
                    log.exception("decode step failed; aborting the batch")
                    out = [(r, self._finish_delta(r, Finish("abort", message=f"engine error: {exc}")))
                           for r in self._active + joining if not r.done]
                    self._active = []
                    batch.drop()
                    self._forget(out)
        rest = [(r, self._finish_delta(r, Finish("abort", message="engine stopped")))
                for r in list(self._rows.values()) if not r.done]
        self._forget(rest)

    def _next_admissions(self) -> list[Row] | None:
        with self._cond:
            while not self._stopping and not self._pending and not self._active:
                self._cond.wait()
            if self._stopping:
                return None
            if not self._active and self.max_wait_s > 0:
                # gather a burst: keep waiting while arrivals keep coming (each within max_wait of the
                # previous), until the batch is full or 8 x max_wait passed; a lone request waits max_wait once
                cap = time.monotonic() + 8 * self.max_wait_s
                seen = len(self._pending)
                deadline = time.monotonic() + self.max_wait_s
                while len(self._pending) < self.max_batch_size and not self._stopping:
                    now = time.monotonic()
                    if len(self._pending) > seen:
                        seen = len(self._pending)
                        deadline = min(now + self.max_wait_s, cap)
                    if now >= deadline:
                        break
                    self._cond.wait(deadline - now)
            room = self.max_batch_size - len(self._active)
            if (self._active and self._pending and len(self._pending) < room
                    and time.monotonic() - self._pending[0].queued_at < self.max_wait_s):
                return []  # rows are running: newcomers wait (at most max_wait) to share one prefill pass
            return [self._pending.popleft() for _ in range(min(room, len(self._pending)))]

    def _iteration(self, batch: KVBatch, joining: list[Row]) -> None:
        out: list[tuple[Row, SequenceDelta]] = []
        for row in joining:
            if row.aborted is not None:
                out.append((row, self._finish_delta(row, Finish("abort", message=row.aborted))))
        joining = [r for r in joining if not r.done]
        self._retire(batch, out)
        stepped, step_logits = [], None
        if self._active:
            try:
                last = torch.tensor([r.out_ids[-1] for r in self._active], dtype=torch.long, device=self.device)
                step_logits = batch.step(last)
            except Exception as exc:  # the batch's forward pass: no single row to blame
                log.exception("decode step of %d sequences failed; ending them", len(self._active))
                for row in self._active:
                    self._fail(row, exc, out)
                self._active = []
                batch.drop()
            else:
                stepped = list(self._active)
        if joining:  # prefilled into the slots after the running rows, which stay as they are until sampled
            joined, logits = self._prefill(batch, joining, out)
            if joined:
                self._active.extend(joined)
                # the step's rows and the newcomers sampled (and retired) together: one sampling call
                stepped += joined
                step_logits = logits if step_logits is None else torch.cat([step_logits, logits])
        if stepped and step_logits is not None:
            self._sample_into(stepped, step_logits, out)
            self._retire(batch, out)
        if self._on_step is not None and (self._active or out):
            self._on_step(len(self._active) + sum(1 for r, d in out if d.finish is not None and d.finish.type != "abort"))
        self.steps += 1
        self.progress_at = time.monotonic()
        self._forget(out)

    def _prefill(self, batch: KVBatch, rows: list[Row], out: list[tuple[Row, SequenceDelta]]):
        """Prefill newcomers together (each on top of its cached prefix, if the prefix cache has one); if that
        fails, one by one and whole, so only the prompts that fail are ended. Returns the rows that joined the
        batch and their logits."""
        hits = self._prefix_hits(rows)
        try:
            return rows, batch.prefill([list(r.req.prompt_ids) for r in rows], self.pad_id, self.device, hits)
        except Exception as exc:  # noqa: BLE001 - found out below, row by row
            if len(rows) == 1:
                self._fail(rows[0], exc, out)
                return [], None
            log.warning("prefill of %d new sequences failed (%r); prefilling them one by one", len(rows), exc)
        joined, parts = [], []
        for row in rows:  # whole prompts: a cached prefix may be what failed
            try:
                parts.append(batch.prefill([list(row.req.prompt_ids)], self.pad_id, self.device))
            except Exception as exc:  # noqa: BLE001 - this row's prompt: end it alone
                self._fail(row, exc, out)
            else:
                joined.append(row)
        return joined, (torch.cat(parts) if parts else None)

    def _prefix_hits(self, rows: list[Row]) -> list[PrefixHit | None] | None:
        """The newcomers' cached prefixes (None: no cache, or no hit at all); stamps each row's epoch."""
        cache = self.prefix_cache
        if cache is None or not cache.enabled:
            return None
        hits = []
        for row in rows:
            row.epoch = cache.epoch  # read before the lookup: an invalidation in between keeps the row out
            hits.append(cache.match(row.req.prompt_ids))
        return hits if any(h is not None for h in hits) else None

    def _keep_prefix(self, batch: KVBatch, index: int, row: Row) -> None:
        """Offer a finished row's KV (its prompt and the outputs fed so far) to the prefix cache."""
        try:
            n, kv = batch.row_kv(index)
            ids = (*row.req.prompt_ids, *row.out_ids)
            if n != len(ids) - 1:  # every sampled token but the last has been fed; anything else: do not guess
                log.warning("sequence %s: %d cached positions for %d ids; not kept", row.req.rid, n, len(ids))
                return
            if self.prefix_cache is not None:
                self.prefix_cache.put(ids[:n], kv, row.epoch)
        except Exception:  # the cache is an optimisation: never fail a row for it
            log.exception("keeping the prefix of sequence %s failed", row.req.rid)

    def _fail(self, row: Row, exc: BaseException, out: list[tuple[Row, SequenceDelta]]) -> None:
        """End one row with ``finish_reason = abort`` because of ``exc``."""
        if row.done:
            return
        row.failed = True
        log.warning("sequence %s ended by an engine error: %r", row.req.rid, exc)
        finish = Finish("abort", message=f"engine error: {exc}")
        try:
            delta = self._finish_delta(row, finish)
        except Exception:  # noqa: BLE001 - its text cannot be decoded either: end it without text
            row.done = True
            delta = SequenceDelta([] if row.req.stream else list(row.out_ids),
                                  [] if row.req.stream else list(row.logprobs), "", finish)
        out.append((row, delta))

    def _retire(self, batch: KVBatch, out: list[tuple[Row, SequenceDelta]]) -> None:
        for row in self._active:
            if not row.done and row.aborted is not None:
                out.append((row, self._finish_delta(row, Finish("abort", message=row.aborted))))
        keep = [i for i, r in enumerate(self._active) if not r.done]
        if self.prefix_cache is not None and self.prefix_cache.enabled:
            for i, r in enumerate(self._active):
                if r.done and not r.failed:
                    self._keep_prefix(batch, i, r)
        if len(keep) != len(self._active):
            keep = _fill_holes(keep)
            batch.keep(keep)
            self._active = [self._active[i] for i in keep]

    def _sample_into(self, rows: list[Row], logits: torch.Tensor, out: list[tuple[Row, SequenceDelta]]) -> None:
        """Sample the rows' next tokens and advance them. If sampling the batch fails, the rows are sampled
        one by one and only those that fail are ended; a row whose advance fails is ended alone."""
        try:
            picks: list[tuple[int, float, list | None] | BaseException] = list(self._sample(rows, logits))
        except Exception as exc:  # noqa: BLE001 - found out below, row by row
            if len(rows) == 1:
                picks = [exc]
            else:
                log.warning("sampling %d rows failed (%r); sampling them one by one", len(rows), exc)
                picks = []
                for i, row in enumerate(rows):
                    try:
                        picks.extend(self._sample([row], logits[i : i + 1]))
                    except Exception as row_exc:  # noqa: BLE001 - this row's own failure
                        picks.append(row_exc)
        for row, pick in zip(rows, picks):
            try:
                if isinstance(pick, BaseException):
                    raise pick
                self._advance(row, *pick, out)
            except Exception as exc:  # noqa: BLE001 - ends this row only
                self._fail(row, exc, out)

    def _adjusted(self, rows: list[Row], logits: torch.Tensor) -> torch.Tensor:
        """The logits with each row's penalties applied and, for a row short of ``min_new_tokens``, its stop
        tokens masked (a copy when anything changes)."""
        changed = None
        for i, row in enumerate(rows):
            short = len(row.out_ids) < row.req.params.min_new_tokens and row.stop_ids
            if row.penalties is None and not short and row.grammar is None:
                continue
            if changed is None:
                changed = logits.float().clone()
            if row.penalties is not None:
                changed[i] = penalised(changed[i], row.penalties)
            if short:
                ids = [t for t in row.stop_ids if t < changed.shape[-1]]
                changed[i, torch.tensor(ids, dtype=torch.long, device=changed.device)] = float("-inf")
            if row.grammar is not None:
                allowed = row.grammar.allowed(changed.device)
                width = min(allowed.numel(), changed.shape[-1])
                changed[i, :width] = changed[i, :width].masked_fill(~allowed[:width], float("-inf"))
                changed[i, width:] = float("-inf")
        return logits if changed is None else changed

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> list[tuple[int, float, list | None]]:
        """(token, logprob, top alternatives or None) per row."""
        logits = self._adjusted(rows, logits)
        rs = RowSampling.of([r.sampling for r in rows], [r.generator for r in rows], logits.device)
        tokens, chosen, full = sample(logits, rs, self._shared_gen)
        tops = None
        k = max(r.req.params.top_logprobs for r in rows)
        if k:
            values, indices = full.topk(min(k, full.shape[-1]), dim=-1)
            tops = (values.tolist(), indices.tolist())
        picks = []
        for i, (row, tok, lp) in enumerate(zip(rows, tokens.tolist(), chosen.tolist())):
            top = None
            if tops is not None and row.top is not None:
                n = row.req.params.top_logprobs
                top = [(tid, v) for v, tid in zip(tops[0][i][:n], tops[1][i][:n])]
            picks.append((tok, lp, top))
        return picks

    def _advance(self, row: Row, tok: int, lp: float, top, out: list[tuple[Row, SequenceDelta]]) -> None:
        p = row.req.params
        row.out_ids.append(tok)
        row.logprobs.append(lp)
        if top is not None and row.top is not None:
            row.top.append(top)
        if row.penalties is not None:
            row.penalties.add(tok)
        if row.grammar is not None:
            row.grammar.consume(tok)
        finish = None
        early = len(row.out_ids) < p.min_new_tokens  # no stop ends it yet
        if row.text is not None:
            row.text.armed = not early
        matched = row.text.push(tok) if row.text is not None else None
        if tok in row.stop_ids and not early:
            finish = Finish("stop", matched=tok)
        elif matched is not None:
            finish = Finish("stop", matched=matched)
        elif len(row.out_ids) >= p.max_new_tokens or len(row.req.prompt_ids) + len(row.out_ids) >= self.context_length:
            finish = Finish("length", length=len(row.out_ids))
        elif row.grammar is not None and row.grammar.complete:  # the structured output is whole: nothing may follow
            finish = Finish("stop", matched=None)
        if finish is not None:
            out.append((row, self._finish_delta(row, finish, sampled=True)))
        elif row.req.stream:
            text = row.text.take_visible(final=False) if row.text is not None else ""
            out.append((row, SequenceDelta([tok], [lp], text, None, [top] if top is not None else None)))

    def _finish_delta(self, row: Row, finish: Finish, sampled: bool = False) -> SequenceDelta:
        """The last delta: everything not yet sent. A streamed row has sent all but the token just
        ``sampled`` (if the finish came with one)."""
        row.done = True
        if row.text is not None:
            row.text.flush()
            text = row.text.take_visible(final=True)
        else:
            text = self.tokenizer.decode(row.out_ids, skip_special_tokens=row.req.params.skip_special_tokens,
                                         clean_up_tokenization_spaces=False)
        if not row.req.stream:
            return SequenceDelta(list(row.out_ids), list(row.logprobs), text, finish, row.top)
        if sampled:
            return SequenceDelta(row.out_ids[-1:], row.logprobs[-1:], text, finish, row.top[-1:] if row.top else None)
        return SequenceDelta([], [], text, finish, [] if row.top is not None else None)

    def _forget(self, out: list[tuple[Row, SequenceDelta]]) -> None:
        if not out:
            return
        with self._cond:
            for row, delta in out:
                if delta.finish is not None:
                    self._rows.pop(row.req.rid, None)
        self._deliver(out)


def _fill_holes(keep: list[int]) -> list[int]:
    """The rows ``keep`` (ascending) in an order that moves fewest of them: those already in the first
    ``len(keep)`` slots stay, and the slots of rows that left take rows from the end."""
    n = len(keep)
    stay = [i for i in keep if i < n]
    tail = [i for i in keep if i >= n]
    kept = set(stay)
    order = []
    for slot in range(n):
        order.append(slot if slot in kept else tail.pop())
    return order
