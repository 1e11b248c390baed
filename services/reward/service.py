"""The reward service object: runs the configured scorers on a batch and combines their values.

Every scorer sees every item; scorers run concurrently. Each scorer call has a timeout and is retried
with exponential backoff (tenacity). A scorer that still fails either fails the request (``on_error:
fail``: RewardRequestError with 502/503/504 naming the scorer and the cause) or marks its items
(``on_error: mark``: score None plus an ItemError). No failure is ever turned into a number.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

from services.reward.errors import InvalidItem, RewardRequestError, ScorerFailure, ScorerTimeout
from services.reward.metrics import RewardMetrics
from services.reward.scorers.base import Scorer, strip_tokens
from services.reward.scorers.registry import build_scorer
from services.reward.settings import RewardSettings
from shared.reward_api import (
    GetRewardRequest,
    GetRewardResponse,
    ItemError,
    ScoreItem,
    ScoreResponse,
    ScorerFailing,
    ScorerInfo,
)

log = logging.getLogger("fleetrl.reward")


def nan_if_none(value: float | None) -> float:
    """A reply's value as OpenRLHF reads it: NaN where FleetRL's reply has no value (a marked failure)."""
    return float("nan") if value is None else float(value)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ScorerFailure) and exc.retryable


def share_endpoint_limits(scorers: Sequence[Scorer]) -> dict[str, tuple[int, list[str]]]:
    """One concurrency gate per endpoint: scorers that call one endpoint (:meth:`Scorer.endpoint_limit`, e.g. two
    judge scorers on one judge server) share a gate at the smallest of their limits, so the endpoint never has
    more calls in flight from this service than that. Returns endpoint -> (limit, scorer names) for those shared."""
    by_endpoint: dict[str, list[tuple[Scorer, int]]] = {}
    for scorer in scorers:
        found = scorer.endpoint_limit()
        if found is not None:
            by_endpoint.setdefault(found[0], []).append((scorer, found[1]))
    shared: dict[str, tuple[int, list[str]]] = {}
    for endpoint, users in by_endpoint.items():
        if len(users) < 2:
            continue
        limit = min(n for _, n in users)
        gate = asyncio.Semaphore(limit)
        for scorer, _ in users:
            scorer.share_endpoint_gate(gate, limit)
        shared[endpoint] = (limit, [s.name for s, _ in users])
    return shared


class RewardService:
    """Holds the scorers; ``score(items)`` is the one thing routes call."""

    def __init__(self, settings: RewardSettings):
        self.settings = settings
        self.metrics = RewardMetrics()
        self.scorers: list[Scorer] = [build_scorer(cfg, self.metrics) for cfg in settings.scorers]
        #: endpoint -> (concurrency limit, scorers) where several scorers call one endpoint
        self.shared_endpoints = share_endpoint_limits(self.scorers)
        #: per scorer whose calls fail now: (monotonic time of the first failure since its last success, last cause)
        self._failing: dict[str, tuple[float, str]] = {}

    async def start(self) -> None:
        for endpoint, (limit, names) in self.shared_endpoints.items():
            log.info("scorers %s call %s: %d calls in flight at most, together (the smallest max_concurrency)",
                     ", ".join(names), endpoint, limit)
        for scorer in self.scorers:
            log.info("starting scorer %s (%s, weight %s)", scorer.name, scorer.kind, scorer.config.weight)
            await scorer.start()

    async def stop(self) -> None:
        for scorer in self.scorers:
            try:
                await scorer.close()
            except Exception:
                log.exception("closing scorer %s failed", scorer.name)

    def describe(self) -> list[ScorerInfo]:
        """What is configured (GET /scorers): names and kinds, never a scorer's settings (python kwargs, remote
        URLs and headers can hold secrets)."""
        return [ScorerInfo(name=s.name, kind=s.kind, weight=s.config.weight, on_error=s.config.on_error)
                for s in self.scorers]

    async def health(self) -> dict[str, str]:
        """Per scorer: "ok" or the error of its check. Raises nothing."""

        async def one(scorer: Scorer) -> str:
            try:
                await asyncio.wait_for(scorer.check(), self.settings.health_timeout_s)
                return "ok"
            except asyncio.TimeoutError:
                return f"check timed out after {self.settings.health_timeout_s}s"
            except ScorerFailure as exc:
                return exc.message
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                return f"{type(exc).__name__}: {exc}"

        results = await asyncio.gather(*(one(s) for s in self.scorers))
        return {s.name: r for s, r in zip(self.scorers, results)}

    def failing(self) -> dict[str, ScorerFailing]:
        """The scorers whose calls have failed since their last success: where, for how long, the last cause."""
        now = time.monotonic()
        by_name = {s.name: s for s in self.scorers}
        return {name: ScorerFailing(where=by_name[name].where, for_s=round(now - since, 1), error=error)
                for name, (since, error) in self._failing.items()}

    def _note(self, scorer: Scorer, failure: BaseException | None) -> None:
        """A call's outcome: a success clears the scorer's failing streak, a failure starts or extends it."""
        if failure is None:
            self._failing.pop(scorer.name, None)
            return
        cause = failure.cause if isinstance(failure, ScorerFailure) else f"{type(failure).__name__}: {failure}"
        since = self._failing.get(scorer.name, (time.monotonic(), ""))[0]
        self._failing[scorer.name] = (since, cause)

    # --- scoring -------------------------------------------------------------------------------------

    async def _call_once(self, scorer: Scorer, items: Sequence[ScoreItem], deadline: float) -> list[float]:
        labels = (scorer.name, scorer.kind)
        timeout = getattr(scorer, "call_timeout", lambda n: scorer.config.timeout_s)(len(items))
        timeout = max(0.001, min(timeout, deadline - time.monotonic()))  # retry.max_total_s bounds every try
        start = time.perf_counter()
        try:
            values = await asyncio.wait_for(scorer.score(items), timeout)
            values = list(values)
            if len(values) != len(items):
                raise ScorerFailure(f"returned {len(values)} values for {len(items)} items")
            for k, v in enumerate(values):
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                    raise ScorerFailure(f"item {k}: value {v!r} is not a finite number")
        except InvalidItem:
            self.metrics.scorer_errors.labels(*labels, "InvalidItem").inc()
            raise
        except asyncio.TimeoutError as exc:
            self.metrics.scorer_errors.labels(*labels, "ScorerTimeout").inc()
            raise ScorerTimeout(f"no answer within {timeout:.1f}s") from exc
        except ScorerFailure as exc:
            self.metrics.scorer_errors.labels(*labels, type(exc).__name__).inc()
            raise
        except Exception as exc:
            self.metrics.scorer_errors.labels(*labels, type(exc).__name__).inc()
            raise ScorerFailure(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.metrics.scorer_latency.labels(*labels).observe(time.perf_counter() - start)
        self.metrics.scorer_items.labels(*labels).inc(len(items))
        return [float(v) for v in values]

    async def _call(self, scorer: Scorer, items: Sequence[ScoreItem]) -> list[float]:
        retry = scorer.config.retry

        def count_retry(state) -> None:
            self.metrics.scorer_retries.labels(scorer.name, scorer.kind).inc()
            log.warning("scorer %s: try %d failed (%s); retrying", scorer.name, state.attempt_number,
                        state.outcome.exception())

        deadline = time.monotonic() + retry.max_total_s
        backoff = wait_exponential(multiplier=retry.backoff_s, min=retry.backoff_s, max=retry.max_backoff_s)

        def stop(state) -> bool:  # out of tries, or the next one would start past retry.max_total_s
            return state.attempt_number >= retry.attempts or time.monotonic() + backoff(state) >= deadline

        tries = 0
        try:
            async for attempt in AsyncRetrying(
                stop=stop,
                wait=backoff,
                retry=retry_if_exception(_retryable),
                before_sleep=count_retry,
                reraise=True,
            ):
                with attempt:
                    tries = attempt.retry_state.attempt_number
                    values = await self._call_once(scorer, items, deadline)
                    self._note(scorer, None)
                    return values
        except ScorerFailure as exc:
            exc.tries = tries
            self._note(scorer, exc)
            raise
        raise AssertionError("unreachable: tenacity reraises the last failure")

    async def score(self, items: Sequence[ScoreItem]) -> ScoreResponse:
        """Score ``items`` with every scorer; raise RewardRequestError when a scorer's policy says fail."""
        if len(items) > self.settings.max_items:
            raise RewardRequestError(413, f"{len(items)} items in one request; the limit is {self.settings.max_items}")
        results = await asyncio.gather(*(self._call(s, items) for s in self.scorers), return_exceptions=True)

        invalid = [(s, r) for s, r in zip(self.scorers, results) if isinstance(r, InvalidItem)]
        if invalid:
            raise RewardRequestError(
                422, "; ".join(f"scorer {s.name!r}: {r}" for s, r in invalid),
                [{"scorer": s.name, "error": str(r)} for s, r in invalid],
            )
        fatal = [(s, r) for s, r in zip(self.scorers, results)
                 if isinstance(r, BaseException) and s.config.on_error == "fail"]
        if fatal:
            raise self._request_error(fatal)

        components: list[dict[str, float | None]] = [{} for _ in items]
        errors: list[ItemError] = []
        for scorer, result in zip(self.scorers, results):
            if isinstance(result, BaseException):
                message = self._describe_failure(scorer, result)
                self.metrics.marked_items.labels(scorer.name).inc(len(items))
                for i in range(len(items)):
                    components[i][scorer.name] = None
                    errors.append(ItemError(index=i, scorer=scorer.name, error=message))
            else:
                for i, value in enumerate(result):
                    components[i][scorer.name] = value
        weights = {s.name: s.config.weight for s in self.scorers}
        scores = [
            None if any(v is None for v in row.values()) else math.fsum(weights[k] * v for k, v in row.items())
            for row in components
        ]
        return ScoreResponse(scores=scores, components=components, errors=errors)

    async def get_reward(self, request: GetRewardRequest) -> GetRewardResponse:
        """OpenRLHF's /get_reward on top of ``score``; marked failures fail here (the protocol has no marker)."""
        # in a thread: stripping special tokens and finding each prompt grow with the queries
        items = await asyncio.to_thread(lambda: [self._openrlhf_item(request, i) for i in range(len(request.query))])
        reply = await self.score(items)
        if reply.errors:
            first = reply.errors[0]
            raise RewardRequestError(
                502,
                f"scorer {first.scorer!r} failed for {len(reply.errors)} item(s) ({first.error}); OpenRLHF's "
                "/get_reward protocol has no per-item error marker, so the request fails",
                [e.model_dump() for e in reply.errors[:50]],
            )
        rewards = [nan_if_none(s) for s in reply.scores]  # None only beside an error
        extra_logs = {s.name: [nan_if_none(row[s.name]) for row in reply.components] for s in self.scorers}
        return GetRewardResponse(rewards=rewards, scores=rewards, extra_logs=extra_logs)

    # --- helpers -------------------------------------------------------------------------------------

    def _strip(self, text: str) -> str:
        """``text`` without strip_tokens at either end, however many (in linear time: a query of 100,000
        ``<pad>`` re-sliced once per token was quadratic, on the event loop)."""
        return strip_tokens(text, self.settings.strip_tokens)

    def _openrlhf_item(self, request: GetRewardRequest, i: int) -> ScoreItem:
        query = self._strip(request.query[i])
        label = request.labels[i] if request.labels is not None else None
        if request.prompts is None:
            return ScoreItem(prompt="", response=query, label=label)
        prompt = self._strip(request.prompts[i])
        at = query.find(prompt)
        if at < 0:
            raise RewardRequestError(
                422, f"query[{i}] does not contain prompts[{i}]; query must be the prompt followed by the response"
            )
        return ScoreItem(prompt=prompt, response=query[at + len(prompt):], label=label)

    @staticmethod
    def _describe_failure(scorer: Scorer, exc: BaseException) -> str:
        tries = getattr(exc, "tries", 1)
        cause = exc.message if isinstance(exc, ScorerFailure) else f"{type(exc).__name__}: {exc}"
        return f"{scorer.where} failed after {tries} tr{'y' if tries == 1 else 'ies'}: {cause}"

    def _request_error(self, failures: list[tuple[Scorer, BaseException]]) -> RewardRequestError:
        status = max(getattr(exc, "status", 502) for _, exc in failures)
        details = [{"scorer": s.name, "error": self._describe_failure(s, exc)} for s, exc in failures]
        return RewardRequestError(status, "; ".join(d["error"] for d in details), details)
