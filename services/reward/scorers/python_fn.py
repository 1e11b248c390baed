"""User reward functions by import path (``module:function``), with OpenRLHF's or verl's signature.

The config names the signature; each is adapted explicitly by its own class (``SIGNATURES``), never
guessed per call, and the function is checked against that signature's protocol when it is loaded (a
function that cannot be called that way fails the service's start, naming the path).

Where the function runs (``isolation``): sync functions run in worker processes (``worker_pool.py``) by
default, so a call that outlives the scorer's ``timeout_s`` is killed with its worker and frees its
capacity; with ``isolation: thread`` they run in the service's threads (shared memory, but a stuck call holds
its thread until it returns: ``/health`` says so once every thread is held). Async functions are awaited on
the service's event loop (at most ``max_workers`` at a time); a timeout cancels them, so they must not block.
A batch is split into one chunk per worker; each adapter's ``run`` scores a chunk the same way everywhere.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from services.reward.errors import ScorerFailure, ScorerUnavailable
from services.reward.scorers.base import Scorer, query_text, render_prompt
from shared.reward_api import ScoreItem
from shared.service_kit.loader import load_object


@runtime_checkable
class OpenRLHFRewardFunc(Protocol):
    """OpenRLHF's ``reward_func(queries, prompts, labels, **kwargs)`` (the config's ``kwargs`` follow)."""

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], /) -> Any: ...


@runtime_checkable
class VerlComputeScore(Protocol):
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)``, called by keyword."""

    def __call__(self, *, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> Any: ...


def load_function(path: str, protocol: type, sys_path: Sequence[str] = ()) -> Callable[..., Any]:
    """Import ``module:function`` (``sys_path`` entries first on ``sys.path``) and check it against the
    signature's ``protocol``; raises :class:`~shared.service_kit.loader.LoadError` saying what is wrong."""
    for entry in sys_path:
        if entry not in sys.path:
            sys.path.insert(0, entry)
    return load_object(path, protocol, what="reward function")


def _as_float(value: Any, where: str) -> float:
    """A result as a finite float. One of the wrong kind (NaN, a string, None) fails without retries: the same
    function gives the same answer again (a raising function is still retried: its cause may pass)."""
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()  # numpy / torch scalars
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScorerFailure(f"{where} is {type(value).__name__} {value!r}, not a number", retryable=False)
    value = float(value)
    if not math.isfinite(value):
        raise ScorerFailure(f"{where} is {value}, not a finite number", retryable=False)
    return value


class _Signature:
    """How one external signature is called (``calls``) and how its results are read (``read``)."""

    protocol: type

    @staticmethod
    def calls(config, items: Sequence[ScoreItem]) -> list[tuple[tuple, dict[str, Any]]]:
        """The (args, kwargs) of each call that scores ``items``."""
        raise NotImplementedError

    @staticmethod
    def read(results: list[Any], n_items: int, offset: int) -> list[float]:
        """One value per item from the calls' results; ``offset`` is the chunk's first item in the batch."""
        raise NotImplementedError

    @classmethod
    def run(cls, fn: Callable[..., Any], config, items: Sequence[ScoreItem], offset: int = 0) -> list[float]:
        """Score a chunk with a sync function, in the calling thread (a worker process or thread)."""
        return cls.read([fn(*args, **kwargs) for args, kwargs in cls.calls(config, items)], len(items), offset)

    @classmethod
    async def run_async(cls, fn: Callable[..., Any], config, items: Sequence[ScoreItem],
                        gate: asyncio.Semaphore) -> list[float]:
        """Score a batch with an async function, at most ``gate``'s worth of calls at a time."""

        async def one(args: tuple, kwargs: dict[str, Any]) -> Any:
            async with gate:
                return await fn(*args, **kwargs)

        results = await asyncio.gather(*(one(a, k) for a, k in cls.calls(config, items)))
        return cls.read(list(results), len(items), 0)


class OpenRLHFSignature(_Signature):
    """``reward_func(queries, prompts, labels, **kwargs) -> {"rewards": [...], "scores"?, "extra_logs"?}``."""

    protocol = OpenRLHFRewardFunc

    @staticmethod
    def calls(config, items: Sequence[ScoreItem]) -> list[tuple[tuple, dict[str, Any]]]:
        queries = [query_text(i) for i in items]
        prompts = [render_prompt(i.prompt) for i in items]
        labels = [i.label for i in items]
        return [((queries, prompts, labels), dict(config.kwargs))]

    @staticmethod
    def read(results: list[Any], n_items: int, offset: int) -> list[float]:
        (result,) = results
        if not isinstance(result, dict) or "rewards" not in result:
            raise ScorerFailure(f"an openrlhf reward_func must return a dict with 'rewards', got {type(result).__name__}",
                                retryable=False)
        rewards = result["rewards"]
        if hasattr(rewards, "tolist"):
            rewards = rewards.tolist()
        if not isinstance(rewards, (list, tuple)) or len(rewards) != n_items:
            got = len(rewards) if isinstance(rewards, (list, tuple)) else type(rewards).__name__
            raise ScorerFailure(f"'rewards' must hold one number per query: {n_items} queries, got {got}",
                                retryable=False)
        return [_as_float(r, f"rewards[{offset + k}]") for k, r in enumerate(rewards)]


class VerlSignature(_Signature):
    """``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {"score": ...}``."""

    protocol = VerlComputeScore

    @staticmethod
    def calls(config, items: Sequence[ScoreItem]) -> list[tuple[tuple, dict[str, Any]]]:
        return [((), {"data_source": item.metadata.get("data_source", config.data_source),
                      "solution_str": item.response, "ground_truth": item.label,
                      # verl: the row's extra_info, {} without one
                      "extra_info": item.metadata.get("extra_info", {}), **config.kwargs})
                for item in items]

    @staticmethod
    def read(results: list[Any], n_items: int, offset: int) -> list[float]:
        values = []
        for k, result in enumerate(results):
            index = offset + k
            if isinstance(result, dict):
                if "score" not in result:
                    raise ScorerFailure(f"item {index}: a verl compute_score dict must hold 'score', got keys "
                                        f"{sorted(result)}", retryable=False)
                result = result["score"]
            values.append(_as_float(result, f"item {index}: compute_score result"))
        return values


SIGNATURES: dict[str, type[_Signature]] = {"openrlhf": OpenRLHFSignature, "verl": VerlSignature}


def chunks(items: Sequence[ScoreItem], n: int, whole: bool) -> list[tuple[int, Sequence[ScoreItem]]]:
    """(offset, chunk) pairs: the batch in ``n`` near-equal chunks, or whole (one call takes the whole batch)."""
    if whole or len(items) <= 1:
        return [(0, items)]
    size = math.ceil(len(items) / n)
    return [(i, items[i : i + size]) for i in range(0, len(items), size)]


class _ProcessRunner:
    """``isolation: process``: chunks run in worker processes that a timeout kills and replaces."""

    def __init__(self, config, metrics):
        from services.reward.scorers.worker_pool import WorkerPool

        replaced = metrics.python_workers_replaced
        self.pool = WorkerPool(config.name, {"config": config.model_dump(mode="json")}, config.max_workers,
                               on_replace=lambda reason: replaced.labels(config.name).inc())

    async def start(self) -> None:
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()

    def check(self) -> None:
        problem = self.pool.check()
        if problem:
            raise ScorerUnavailable(problem)

    async def run(self, items: Sequence[ScoreItem], offset: int) -> list[float]:
        reply = await self.pool.run({"items": [i.model_dump(mode="json") for i in items], "offset": offset})
        if "error" in reply:
            raise ScorerFailure(reply["error"], retryable=reply.get("retryable", True))
        return reply["values"]


class _ThreadRunner:
    """``isolation: thread``: chunks run in the service's threads; a stuck call keeps its thread (reported)."""

    def __init__(self, config, signature: type[_Signature], fn: Callable[..., Any]):
        self.config, self.signature, self.fn = config, signature, fn
        self.executor = ThreadPoolExecutor(config.max_workers, thread_name_prefix=f"reward-{config.name}")
        self.running: dict[int, float] = {}  # call id -> start (monotonic)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def check(self) -> None:
        now = time.monotonic()
        stuck = sum(1 for t in list(self.running.values()) if now - t > self.config.timeout_s)
        if stuck >= self.config.max_workers:
            raise ScorerUnavailable(f"all {stuck} threads are held by calls past timeout_s ({self.config.timeout_s:g}s); "
                                    "a thread cannot be stopped: use isolation: process")

    def _run(self, items: Sequence[ScoreItem], offset: int) -> list[float]:
        key = id(items)
        self.running[key] = time.monotonic()
        try:
            return self.signature.run(self.fn, self.config, items, offset)
        finally:
            self.running.pop(key, None)

    async def run(self, items: Sequence[ScoreItem], offset: int) -> list[float]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._run, items, offset)


class PythonScorer(Scorer):
    """Calls a user function through its named signature adapter, where ``isolation`` says."""

    kind = "python"

    def __init__(self, config, metrics):
        super().__init__(config, metrics)
        self._signature = SIGNATURES[config.signature]
        self._fn: Callable[..., Any] | None = None
        self._runner: _ProcessRunner | _ThreadRunner | None = None
        self._gate: asyncio.Semaphore | None = None

    async def start(self) -> None:
        # loaded here too: the signature is checked before anything starts, and async functions run here
        fn = load_function(self.config.function, self._signature.protocol, self.config.sys_path)
        if inspect.iscoroutinefunction(fn):
            self._fn, self._gate = fn, asyncio.Semaphore(self.config.max_workers)
            return
        if self.config.isolation == "process":
            self._runner = _ProcessRunner(self.config, self.metrics)
        else:
            self._runner = _ThreadRunner(self.config, self._signature, fn)
        await self._runner.start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.close()

    async def check(self) -> None:
        if self._runner is not None:
            self._runner.check()

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        if self._runner is None:
            if self._fn is None or self._gate is None:
                raise RuntimeError(f"python scorer {self.name!r} used before start()")
            return await self._signature.run_async(self._fn, self.config, items, self._gate)
        parts = chunks(items, self.config.max_workers, whole=self._signature is OpenRLHFSignature)
        values = await asyncio.gather(*(self._runner.run(chunk, offset) for offset, chunk in parts))
        return [v for part in values for v in part]
