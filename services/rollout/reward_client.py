"""Client of the reward service's ``POST /score`` with timeouts and retry with backoff.

A reward is never invented: while the reward service is down (connection errors, 5xx, 429) the client
waits and retries, up to ``max_attempts`` tries and ``max_retry_s`` seconds in all; then it raises
:class:`RewardUnavailable` saying so, and the worker fails the prompt with that reason (redelivered, then
dead-lettered), freeing its slot and its lease. A 4xx other than 429 means the request itself is wrong:
:class:`RewardRejected`, and the prompt is failed (then dead-lettered).

**Calls made together go as one request** (``batch_s``, the worker's ``reward_batch_ms``): a call waits up to
that long for others (the groups of one engine batch finish together), and they are scored by one ``/score``
request, each call getting its own items' scores, components and errors back. One request of 64 items costs
about what one of 8 does, while 8 requests queue behind each other in the reward service (3.1 ms against
17.2 ms here: ``docs/benchmarks.md``). A refused combined request (4xx: one call's item is what is wrong) is
sent again call by call, so only that call is refused; an unavailable service fails every call of it, as it
would have alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from shared.reward_api import ScoreItem, ScoreRequest, ScoreResponse

log = logging.getLogger(__name__)


class RewardRejected(ValueError):
    """The reward service refused the request (4xx): retrying the same request cannot help."""


class RewardUnavailable(RuntimeError):
    """The reward service could not answer right now (retried)."""


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (RewardUnavailable, httpx.TransportError))


class RewardClient:
    def __init__(self, base_url: str, timeout_s: float, backoff_max_s: float,
                 on_retry: Callable[[BaseException], None] | None = None, max_attempts: int = 20,
                 max_retry_s: float = 300.0, token: str | None = None, batch_s: float = 0.0,
                 batch_items: int = 4096) -> None:
        self.url = base_url.rstrip("/") + "/score"
        self.max_attempts = max_attempts
        self.max_retry_s = max_retry_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}  # the reward service's auth_token
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
                                         headers=headers)
        self._backoff_max = backoff_max_s
        self._on_retry = on_retry
        self.batch_s, self.batch_items = batch_s, batch_items
        self._waiting: list[tuple[list[ScoreItem], asyncio.Future]] = []  # calls gathered for the next request
        self._flush: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task] = set()

    async def aclose(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        for _, fut in self._waiting:
            fut.cancel()
        self._waiting = []
        for t in list(self._sending):
            t.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        await self._client.aclose()

    async def score(self, items: list[ScoreItem]) -> ScoreResponse:
        """Scores for ``items`` (same order). Retries while the reward service is down, within the limits; past
        them :class:`RewardUnavailable` says how many tries over how long, and the last error. With ``batch_s``
        the call may share its request with others made within that time (module docstring)."""
        if self.batch_s <= 0 or len(items) >= self.batch_items:
            return await self._score(items)
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((list(items), fut))
        if sum(len(x) for x, _ in self._waiting) >= self.batch_items:
            self._send_waiting()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.batch_s, self._send_waiting)
        return await fut

    def _send_waiting(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        calls, self._waiting = [c for c in self._waiting if not c[1].done()], []  # a cancelled caller is gone
        if calls:
            task = asyncio.get_running_loop().create_task(self._send(calls))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, calls: list[tuple[list[ScoreItem], asyncio.Future]]) -> None:
        """One request for ``calls``; each future gets its own part of the reply (or the failure)."""
        replies: list[ScoreResponse] | list[ScoreResponse | BaseException]
        try:
            if len(calls) == 1:
                replies = [await self._score(calls[0][0])]
            else:
                try:
                    whole = await self._score([it for items, _ in calls for it in items])
                except RewardRejected:  # which call's items were refused? each on its own: only that one fails
                    replies = await asyncio.gather(*(self._score(items) for items, _ in calls),
                                                   return_exceptions=True)
                else:
                    replies = _split(whole, [len(items) for items, _ in calls])
        except BaseException as exc:  # handed to every caller (cancelled: they are cancelled too)
            for _, fut in calls:
                if not fut.done():
                    fut.cancel() if isinstance(exc, asyncio.CancelledError) else fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, fut), reply in zip(calls, replies):
            if fut.done():
                continue
            if isinstance(reply, BaseException):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

    async def _score(self, items: list[ScoreItem]) -> ScoreResponse:
        """One request for ``items``, retried within the limits."""
        body = ScoreRequest(items=items).model_dump(mode="json")
        started = time.monotonic()
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_retryable),
                wait=wait_exponential_jitter(initial=0.2, max=self._backoff_max),
                stop=stop_after_attempt(self.max_attempts) | stop_after_delay(self.max_retry_s),
                before_sleep=self._before_sleep,
                reraise=True,
            ):
                with attempt:
                    return await self._once(body, len(items))
        except RewardUnavailable as exc:
            raise RewardUnavailable(
                f"the reward service did not score after {attempt.retry_state.attempt_number} tries over "
                f"{time.monotonic() - started:.1f}s (limits: worker.reward_max_attempts {self.max_attempts}, "
                f"worker.reward_max_retry_s {self.max_retry_s:g}); last: {exc}") from exc
        raise AssertionError("unreachable")

    async def _once(self, body: dict, n: int) -> ScoreResponse:
        try:
            r = await self._client.post(self.url, json=body)
        except httpx.TransportError as exc:
            raise RewardUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        if r.status_code == 429 or r.status_code >= 500:
            raise RewardUnavailable(f"{self.url} answered {r.status_code}: {r.text[:300]}")
        if r.status_code >= 400:
            raise RewardRejected(f"{self.url} refused the request ({r.status_code}): {r.text[:500]}")
        reply = ScoreResponse.model_validate(r.json())
        if len(reply.scores) != n:
            raise RewardRejected(f"{self.url} returned {len(reply.scores)} scores for {n} items")
        return reply

    def _before_sleep(self, state) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("reward service not answering (attempt %d): %s; retrying", state.attempt_number, exc)
        if self._on_retry is not None and exc is not None:
            self._on_retry(exc)


def _split(reply: ScoreResponse, sizes: list[int]) -> list[ScoreResponse]:
    """The reply to a combined request cut back into the replies to its calls (``sizes`` items each, in order)."""
    out, start = [], 0
    for n in sizes:
        end = start + n
        errors = [e.model_copy(update={"index": e.index - start}) for e in reply.errors if start <= e.index < end]
        out.append(ScoreResponse(scores=reply.scores[start:end], components=reply.components[start:end],
                                 errors=errors))
        start = end
    return out
