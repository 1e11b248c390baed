"""Dynamic batching: items from concurrent requests share forward passes.

Submitted inputs wait in one queue. A single loop takes the first waiting input, everything already
queued behind it, and whatever else arrives within ``max_wait_s``, up to ``max_batch_size``; it runs
``run_batch`` on them in a dedicated thread (so the event loop keeps accepting requests) and resolves
each caller's future. Inputs whose caller gave up (timeout, disconnect) are skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class DynamicBatcher(Generic[T]):
    def __init__(
        self,
        run_batch: Callable[[list[T]], list[float]],
        *,
        max_batch_size: int,
        max_wait_s: float,
        name: str = "batcher",
        on_batch: Callable[[int], None] = lambda _: None,
    ):
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._queue: asyncio.Queue[tuple[T, asyncio.Future]] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self._queue.empty():
            _, fut = self._queue.get_nowait()
            if not fut.done():
                fut.set_exception(RuntimeError("the scorer is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, inputs: Sequence[T]) -> list[float]:
        """Score ``inputs`` (possibly across several batches, shared with other callers)."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in inputs]
        for x, fut in zip(inputs, futures):
            self._queue.put_nowait((x, fut))
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for fut in futures:
                fut.cancel()  # no-op for finished ones; lets the loop skip the rest

    async def _collect(self) -> list[tuple[T, asyncio.Future]]:
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return [(x, fut) for x, fut in batch if not fut.done()]

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            if not batch:
                continue
            inputs = [x for x, _ in batch]
            self._on_batch(len(inputs))
            try:
                values = await loop.run_in_executor(self._executor, self._run_batch, inputs)
                if len(values) != len(inputs):
                    raise RuntimeError(f"batch of {len(inputs)} produced {len(values)} values")
            except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), value in zip(batch, values):
                if not fut.done():
                    fut.set_result(value)
