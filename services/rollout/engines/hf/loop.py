"""The hf engine's decode loop: one dedicated thread, continuous batching over a KV cache.

Sequences wait in a queue; the loop admits up to ``max_batch_size`` of them into the running batch at
every step boundary (prefill of the newcomers, merged into the cache), steps all rows together,
samples per row (own temperature / top-k / top-p / seed), and retires rows as they finish (stop token,
stop string, length, abort) — so a long sequence never holds a short one back. When the loop is
idle, the first arrival waits for company as long as more keep arriving within ``max_wait`` of each
other (at most ``8 x max_wait``), so a burst of clients starts as one batch.

Results go back to the asyncio side through ``deliver`` (called from this thread with a list of
``(row, delta)`` pairs; the engine hops them onto the event loop).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from services.rollout.engines.hf.batch import KVBatch
from services.rollout.engines.hf.sampling import RowSampling, sample
from services.rollout.engines.hf.text import IncrementalText
from services.rollout.engines.types import Finish, SequenceDelta, SequenceRequest

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Row:
    """One sequence in the loop."""

    req: SequenceRequest
    stop_ids: frozenset[int]
    text: IncrementalText | None
    generator: torch.Generator | None
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    aborted: str | None = None  # abort message once aborted
    done: bool = False


Deliver = Callable[[list[tuple[Row, SequenceDelta]]], None]


class DecodeLoop:
    def __init__(self, model, tokenizer, device: torch.device, *, max_batch_size: int, max_wait_s: float,
                 context_length: int, eos_ids: frozenset[int], deliver: Deliver,
                 on_step: Callable[[int], None] | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.context_length = context_length
        self.eos_ids = eos_ids
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (min(eos_ids) if eos_ids else 0)
        self._deliver = deliver
        self._on_step = on_step
        self._cond = threading.Condition()
        self._pending: deque[Row] = deque()
        self._active: list[Row] = []
        self._rows: dict[str, Row] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._shared_gen = torch.Generator(device=device)
        self._shared_gen.seed()
        self.steps = 0

    # ---- called from the event loop ----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hf-decode-loop", daemon=True)
        self._thread.start()

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

    def submit(self, req: SequenceRequest) -> Row:
        p = req.params
        stops = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos_ids)
        # incremental text only where it is needed during decoding (stop strings, streaming)
        text = (IncrementalText(self.tokenizer, p.skip_special_tokens, p.stop, p.no_stop_trim)
                if p.stop or req.stream else None)
        gen = None
        if p.seed is not None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(p.seed)
        row = Row(req=req, stop_ids=stops, text=text, generator=gen, top=[] if p.top_logprobs else None)
        with self._cond:
            if self._stopping:
                raise RuntimeError("the decode loop is stopped")
            self._rows[req.rid] = row
            self._pending.append(row)
            self._cond.notify_all()
        return row

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
                try:
                    self._iteration(batch, joining)
                except Exception as exc:  # an engine failure ends the batch, never the loop
                    log.exception("decode step failed; aborting the batch")
                    out = [(r, self._finish_delta(r, Finish("abort", message=f"engine error: {exc}")))
                           for r in self._active + joining if not r.done]
                    self._active = []
                    batch.keep([])
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
            return [self._pending.popleft() for _ in range(min(room, len(self._pending)))]

    def _iteration(self, batch: KVBatch, joining: list[Row]) -> None:
        out: list[tuple[Row, SequenceDelta]] = []
        for row in joining:
            if row.aborted is not None:
                out.append((row, self._finish_delta(row, Finish("abort", message=row.aborted))))
        joining = [r for r in joining if not r.done]
        self._retire(batch, out)
        if self._active:
            last = torch.tensor([r.out_ids[-1] for r in self._active], dtype=torch.long, device=self.device)
            logits = batch.step(last)
            self._sample_into(self._active, logits, out)
            self._retire(batch, out)
        if joining:
            logits = batch.prefill([list(r.req.prompt_ids) for r in joining], self.pad_id, self.device)
            self._active.extend(joining)
            self._sample_into(joining, logits, out)
            self._retire(batch, out)
        if self._on_step is not None and (self._active or out):
            self._on_step(len(self._active) + sum(1 for r, d in out if d.finish is not None and d.finish.type != "abort"))
        self.steps += 1
        self._forget(out)

    def _retire(self, batch: KVBatch, out: list[tuple[Row, SequenceDelta]]) -> None:
        for row in self._active:
            if not row.done and row.aborted is not None:
                out.append((row, self._finish_delta(row, Finish("abort", message=row.aborted))))
        keep = [i for i, r in enumerate(self._active) if not r.done]
        if len(keep) != len(self._active):
            batch.keep(keep)
            self._active = [self._active[i] for i in keep]

    def _sample_into(self, rows: list[Row], logits: torch.Tensor, out: list[tuple[Row, SequenceDelta]]) -> None:
        params = [r.req.params for r in rows]
        dev = logits.device
        rs = RowSampling(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=dev),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=dev),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev),
            min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev),
            generators=[r.generator for r in rows],
        )
        tokens, chosen, full = sample(logits, rs, self._shared_gen)
        tops = None
        k = max(p.top_logprobs for p in params)
        if k:
            values, indices = full.topk(min(k, full.shape[-1]), dim=-1)
            tops = (values.tolist(), indices.tolist())
        for i, (row, tok, lp) in enumerate(zip(rows, tokens.tolist(), chosen.tolist())):
            top = None
            if tops is not None and row.top is not None:
                n = row.req.params.top_logprobs
                top = [(tid, v) for v, tid in zip(tops[0][i][:n], tops[1][i][:n])]
            self._advance(row, tok, lp, top, out)

    def _advance(self, row: Row, tok: int, lp: float, top, out: list[tuple[Row, SequenceDelta]]) -> None:
        p = row.req.params
        row.out_ids.append(tok)
        row.logprobs.append(lp)
        if top is not None:
            row.top.append(top)
        finish = None
        matched = row.text.push(tok) if row.text is not None else None
        if tok in row.stop_ids:
            finish = Finish("stop", matched=tok)
        elif matched is not None:
            finish = Finish("stop", matched=matched)
        elif len(row.out_ids) >= p.max_new_tokens or len(row.req.prompt_ids) + len(row.out_ids) >= self.context_length:
            finish = Finish("length", length=len(row.out_ids))
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
