"""User reward functions by import path (``module:function``), with OpenRLHF's or verl's signature.

The config names the signature; each is adapted explicitly by its own class (``SIGNATURES``), never
guessed per call, and the function is checked against that signature's protocol when it is loaded (a
function that cannot be called that way fails the service's start, naming the path). Sync functions run
in a thread pool so blocking user code cannot stall the event loop; async functions are awaited (at most
``max_workers`` at a time).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from services.reward.errors import ScorerFailure
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
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()  # numpy / torch scalars
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScorerFailure(f"{where} is {type(value).__name__} {value!r}, not a number")
    value = float(value)
    if not math.isfinite(value):
        raise ScorerFailure(f"{where} is {value}, not a finite number")
    return value


class _Signature:
    """How one external signature is called and how its result is read; ``protocol`` is the signature."""

    protocol: type

    def __init__(self, fn: Callable[..., Any], config, executor: ThreadPoolExecutor):
        self.fn = fn
        self.config = config
        self.executor = executor
        self.is_async = inspect.iscoroutinefunction(fn)

    async def _call(self, *args, **kwargs) -> Any:
        if self.is_async:
            return await self.fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: self.fn(*args, **kwargs))


class OpenRLHFSignature(_Signature):
    """``reward_func(queries, prompts, labels, **kwargs) -> {"rewards": [...], "scores"?, "extra_logs"?}``."""

    protocol = OpenRLHFRewardFunc

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        queries = [query_text(i) for i in items]
        prompts = [render_prompt(i.prompt) for i in items]
        labels = [i.label for i in items]
        result = await self._call(queries, prompts, labels, **self.config.kwargs)
        if not isinstance(result, dict) or "rewards" not in result:
            raise ScorerFailure(f"an openrlhf reward_func must return a dict with 'rewards', got {type(result).__name__}")
        rewards = result["rewards"]
        if hasattr(rewards, "tolist"):
            rewards = rewards.tolist()
        if not isinstance(rewards, (list, tuple)) or len(rewards) != len(items):
            got = len(rewards) if isinstance(rewards, (list, tuple)) else type(rewards).__name__
            raise ScorerFailure(f"'rewards' must hold one number per query: {len(items)} queries, got {got}")
        return [_as_float(r, f"rewards[{k}]") for k, r in enumerate(rewards)]


class VerlSignature(_Signature):
    """``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {"score": ...}``."""

    protocol = VerlComputeScore

    async def _one(self, item: ScoreItem, index: int, gate: asyncio.Semaphore) -> float:
        extra_info = item.metadata.get("extra_info", {})  # verl: the row's extra_info, {} without one
        data_source = item.metadata.get("data_source", self.config.data_source)
        async with gate:
            result = await self._call(
                data_source=data_source, solution_str=item.response, ground_truth=item.label,
                extra_info=extra_info, **self.config.kwargs,
            )
        if isinstance(result, dict):
            if "score" not in result:
                raise ScorerFailure(f"item {index}: a verl compute_score dict must hold 'score', got keys {sorted(result)}")
            result = result["score"]
        return _as_float(result, f"item {index}: compute_score result")

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        gate = asyncio.Semaphore(self.config.max_workers)
        return list(await asyncio.gather(*(self._one(item, k, gate) for k, item in enumerate(items))))


SIGNATURES: dict[str, type[_Signature]] = {"openrlhf": OpenRLHFSignature, "verl": VerlSignature}


class PythonScorer(Scorer):
    """Calls a user function through its named signature adapter."""

    kind = "python"

    def __init__(self, config, metrics):
        super().__init__(config, metrics)
        self._executor: ThreadPoolExecutor | None = None
        self._adapter: _Signature | None = None

    async def start(self) -> None:
        signature = SIGNATURES[self.config.signature]
        fn = load_function(self.config.function, signature.protocol, self.config.sys_path)
        self._executor = ThreadPoolExecutor(self.config.max_workers, thread_name_prefix=f"reward-{self.name}")
        self._adapter = signature(fn, self.config, self._executor)

    async def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        return await self._adapter.score(items)
