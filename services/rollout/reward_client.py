"""Client of the reward service's ``POST /score`` with timeouts and retry with backoff.

A reward is never invented: while the reward service is down (connection errors, 5xx, 429) the client
waits and retries, up to ``max_attempts`` tries and ``max_retry_s`` seconds in all; then it raises
:class:`RewardUnavailable` saying so, and the worker fails the prompt with that reason (redelivered, then
dead-lettered), freeing its slot and its lease. A 4xx other than 429 means the request itself is wrong:
:class:`RewardRejected`, and the prompt is failed (then dead-lettered).
"""

from __future__ import annotations

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
                 max_retry_s: float = 300.0, token: str | None = None) -> None:
        self.url = base_url.rstrip("/") + "/score"
        self.max_attempts = max_attempts
        self.max_retry_s = max_retry_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}  # the reward service's auth_token
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
                                         headers=headers)
        self._backoff_max = backoff_max_s
        self._on_retry = on_retry

    async def aclose(self) -> None:
        await self._client.aclose()

    async def score(self, items: list[ScoreItem]) -> ScoreResponse:
        """Scores for ``items`` (same order). Retries while the reward service is down, within the limits; past
        them :class:`RewardUnavailable` says how many tries over how long, and the last error."""
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
