"""Futures with the tinker client's polling semantics, and the ordered workers that fulfil them.

Every training or sampling call answers ``{request_id, model_id}`` at once; the work runs off the event loop and
``retrieve_future`` long-polls its result: the result (JSON, or protobuf bytes for forward_backward and sample),
``{"error", "category"}`` for a failure, ``try_again`` while it runs, 410 for an id unknown or expired.

A training model's requests run one at a time on its own thread in ``seq_id`` order (the client numbers each
training client's requests from 1); a request whose predecessor never arrives runs after ``gap_timeout_s``."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from services.learner.tinker.errors import Gone
from shared.service_kit.errors import ServiceError

log = logging.getLogger(__name__)
RETRIEVED_KEEP_S = 60.0


@dataclass
class Entry:
    created: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Any = None  # dict (JSON) or bytes (protobuf)
    error: str | None = None
    category: str = "server"
    finished: float | None = None
    retrieved: float | None = None


class FutureStore:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, Entry] = {}
        self.listener: Callable[[str, Entry], None] | None = None  # told of every settled request

    def create(self) -> str:
        self._expire()
        request_id = uuid.uuid4().hex
        self._entries[request_id] = Entry(created=self._clock())
        return request_id

    def settle(self, request_id: str, outcome: Callable[[], Any]) -> None:
        """Run ``outcome`` (already computed: it only returns or raises) and record its result or error."""
        entry = self._entries.get(request_id)
        if entry is None:
            return
        try:
            entry.result = outcome()
        except ServiceError as exc:  # the user's mistake: said as it is
            entry.error, entry.category = exc.message, "user"
        except Exception as exc:  # a bug or a broken model: logged with its traceback, said in one line
            log.exception("request %s failed", request_id)
            entry.error, entry.category = f"{type(exc).__name__}: {exc}", "server"
        entry.finished = self._clock()
        entry.done.set()
        if self.listener is not None:
            self.listener(request_id, entry)

    def has(self, request_id: str) -> bool:
        return request_id in self._entries

    def forget(self, request_id: str) -> bool:
        """Drop a request (cancelled, or its result retrieved): a job not started yet does not run."""
        return self._entries.pop(request_id, None) is not None

    async def retrieve(self, request_id: str, wait_s: float) -> Entry | None:
        """The finished entry, or None when it is still running after ``wait_s``."""
        entry = self._entries.get(request_id)
        if entry is None:
            raise Gone(f"request_id {request_id!r} is unknown or its result expired; submit the request again")
        try:
            await asyncio.wait_for(entry.done.wait(), wait_s)
        except TimeoutError:
            return None
        entry.retrieved = self._clock()
        return entry

    def pending(self) -> int:
        return sum(1 for e in self._entries.values() if not e.done.is_set())

    def _expire(self) -> None:
        """Results go ``ttl_s`` after they finished, or a minute after the client fetched them (a re-poll after a
        dropped connection still finds them)."""
        now = self._clock()
        for rid in [r for r, e in self._entries.items()
                    if (e.finished is not None and now - e.finished > self.ttl_s)
                    or (e.retrieved is not None and now - e.retrieved > RETRIEVED_KEEP_S)]:
            del self._entries[rid]


class OrderedWorker:
    """One thread; jobs run in ``seq_id`` order (``None``: after those queued), each settles its future."""

    def __init__(self, name: str, store: FutureStore, gap_timeout_s: float) -> None:
        self.name = name
        self.store = store
        self.gap_timeout_s = gap_timeout_s
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"tinker-{name}")
        self.next_seq: int | None = None
        self._heap: list[tuple[int, int, str, Callable[[], Any]]] = []
        self._counter = itertools.count()
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.running: str | None = None

    def submit(self, request_id: str, seq_id: int | None, job: Callable[[], Any]) -> None:
        order = seq_id if seq_id is not None else (self.next_seq or 0) + len(self._heap)
        heapq.heappush(self._heap, (order, next(self._counter), request_id, job))
        self._wake.set()

    def skip(self, seq_id: int | None) -> None:
        """A request refused at the door (400) still used its seq_id: the ones after it must not wait for it."""
        if seq_id is not None:
            heapq.heappush(self._heap, (seq_id, next(self._counter), "", lambda: None))
            self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            head = self._heap[0][0]
            if self.next_seq is not None and head > self.next_seq:
                # a gap: wait for the missing request a while, then go on without it
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.gap_timeout_s)
                    continue
                except TimeoutError:
                    log.warning("%s: seq_id %d never arrived after %.0fs; running seq_id %d", self.name,
                                self.next_seq, self.gap_timeout_s, head)
            order, _, request_id, job = heapq.heappop(self._heap)
            self.next_seq = order + 1
            if not request_id or not self.store.has(request_id):  # a skipped seq_id, or a cancelled request
                continue
            self.running = request_id
            try:
                value = await loop.run_in_executor(self.executor, _capture, job)
            finally:
                self.running = None
            self.store.settle(request_id, value)

    def expect(self, seq_id: int) -> None:
        """The next seq_id this worker waits for (after create_model: 1)."""
        self.next_seq = seq_id

    def queued(self) -> int:
        return len(self._heap)

    def close_nowait(self) -> None:
        self._task.cancel()

    async def close(self) -> None:
        self._task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)


def _capture(job: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``job`` on the worker thread; hand back a thunk that returns its value or raises its error."""
    try:
        value = job()
    except BaseException as exc:  # noqa: BLE001 -- re-raised by the thunk on the loop, where it is recorded
        err = exc

        def fail() -> Any:
            raise err

        return fail
    return lambda: value


class CompletionLog:
    """What ``retrieve_futures`` reports: the requests of a poll target (a sampling session and clone) that
    finished, each under a cursor; a poll returns those after its ``prev_cursor`` (and trims the ones before),
    long-polling while there are none."""

    def __init__(self) -> None:
        self.cursor = 0
        self._events: dict[tuple[str, int], list[tuple[int, str, str, int | None]]] = {}
        self._wake: dict[tuple[str, int], asyncio.Event] = {}

    def add(self, key: tuple[str, int], request_id: str, entry: Entry) -> None:
        self.cursor += 1
        size = len(entry.result) if isinstance(entry.result, bytes) else None
        state = "failed" if entry.error is not None else "finished"
        self._events.setdefault(key, []).append((self.cursor, request_id, state, size))
        self._wake.setdefault(key, asyncio.Event()).set()

    async def read(self, key: tuple[str, int], prev_cursor: int, wait_s: float) -> tuple[list[dict], int]:
        events = self._events.setdefault(key, [])
        events[:] = [e for e in events if e[0] > prev_cursor]
        wake = self._wake.setdefault(key, asyncio.Event())
        if not events and wait_s > 0:
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), wait_s)
            except TimeoutError:
                pass
            events = [e for e in self._events.get(key, []) if e[0] > prev_cursor]
        out = [{"state": st, "request_id": rid, **({"response_payload_uncompressed_size": n} if st == "finished" else {})}
               for _, rid, st, n in events]
        return out, max([prev_cursor, *(e[0] for e in events)])

    def drop(self, session: str) -> None:
        for key in [k for k in self._events if k[0] == session]:
            self._events.pop(key, None)
            self._wake.pop(key, None)
