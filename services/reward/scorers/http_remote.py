"""A remote reward service as a scorer: FleetRL ``/score`` or OpenRLHF ``/get_reward``.

One pooled ``httpx.AsyncClient`` per scorer, a concurrency limit, a timeout per remote call and a
circuit breaker. Retries with backoff happen around the whole scorer call (``services.reward.service``),
bounded in count and in total time (``retry.attempts``, ``retry.max_total_s``). The ``api_key`` and header
values are secrets: they are sent, never logged; errors name the remote by scheme, host and path only (no
user:password, no query string).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from typing import Any

import httpx

from services.reward.errors import ScorerFailure, ScorerTimeout, ScorerUnavailable
from services.reward.scorers.base import Scorer, query_text, render_prompt
from services.reward.scorers.circuit_breaker import CircuitBreaker
from shared.reward_api import ScoreItem, ScoreRequest, ScoreResponse


class FleetRLProtocol:
    """``POST /score`` with ScoreRequest; reads ``scores`` (a null score there is a failure here)."""

    @staticmethod
    def payload(items: Sequence[ScoreItem]) -> dict[str, Any]:
        return ScoreRequest(items=list(items)).model_dump(mode="json")

    @staticmethod
    def values(body: Any, n: int) -> list[float]:
        if not isinstance(body, dict) or not isinstance(body.get("scores"), list):
            raise ScorerFailure(f"the reply has no scores (it was {str(body)[:120]})")
        reply = ScoreResponse.model_validate(body)
        if reply.errors:
            first = reply.errors[0]
            raise ScorerFailure(f"remote marked {len(reply.errors)} item(s) failed, e.g. item {first.index} "
                                f"by its scorer {first.scorer!r}: {first.error}")
        if len(reply.scores) != n:
            raise ScorerFailure(f"remote returned {len(reply.scores)} scores for {n} items")
        values = []
        for k, s in enumerate(reply.scores):
            if s is None:
                raise ScorerFailure(f"remote scores[{k}] is null but no error marks that item")
            values.append(float(s))
        return values


class OpenRLHFProtocol:
    """``POST /get_reward`` with ``{"query", "prompts", "labels"}``; reads ``rewards`` (OpenRLHF's trainer does)."""

    @staticmethod
    def payload(items: Sequence[ScoreItem]) -> dict[str, Any]:
        return {
            "query": [query_text(i) for i in items],
            "prompts": [render_prompt(i.prompt) for i in items],
            "labels": [i.label for i in items],
        }

    @staticmethod
    def values(body: Any, n: int) -> list[float]:
        # Lenient like OpenRLHF's own client: `rewards`, else `scores`; other keys are the server's business.
        rewards = body.get("rewards", body.get("scores")) if isinstance(body, dict) else None
        if not isinstance(rewards, list):
            raise ScorerFailure(f"the reply has no rewards (it was {str(body)[:120]})")
        if len(rewards) != n:
            raise ScorerFailure(f"remote returned {len(rewards)} rewards for {n} queries")
        values = []
        for k, r in enumerate(rewards):
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
                raise ScorerFailure(f"remote rewards[{k}] is {r!r}, not a finite number")
            values.append(float(r))
        return values


PROTOCOLS: dict[str, type[FleetRLProtocol | OpenRLHFProtocol]] = {
    "fleetrl": FleetRLProtocol, "openrlhf": OpenRLHFProtocol}


def shown_url(url: str) -> str:
    """``url`` as errors and logs show it: scheme, host, port and path (credentials and query left out)."""
    u = httpx.URL(url)
    return str(u.copy_with(username=None, password=None, query=None, fragment=None))


def short_reason(exc: BaseException) -> str:
    """A transport error in a few words (``Connection refused``, not ``[Errno 111] Connection refused``)."""
    inner: BaseException | None = exc
    while inner is not None:  # the innermost OS error says it best (asyncio's "All connection attempts failed" not)
        if isinstance(inner, OSError) and inner.errno:
            return os.strerror(inner.errno)
        inner = inner.__cause__ or inner.__context__
    text = str(exc) or type(exc).__name__
    return text.split("] ", 1)[-1] if text.startswith("[Errno") else text


def answered(response: httpx.Response, limit: int = 300) -> str:
    """A reply that is not a 200, in one line: ``answered 404: {"detail":"Not Found"}``; an HTML error page (a
    stdlib or proxy server's) by its status and reason, ``answered 404 Not Found (an HTML page)``, never the
    start of its markup."""
    content_type = response.headers.get("content-type", "")
    text = " ".join(response.text.split())
    if "html" in content_type or text[:15].lower().startswith(("<!doctype html", "<html")):
        return f"answered {response.status_code} {response.reason_phrase} (an HTML page)".replace("  ", " ")
    return f"answered {response.status_code}" + (f": {text[:limit]}" if text else "")


def first_error(exc: ValueError) -> str:
    """A reply that is not what the protocol says, in one line: pydantic's first error (where and what)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(x) for x in first.get('loc', ())) or 'the body'}: {first.get('msg')}"
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def where(config) -> str:
    """An http scorer as errors name it: ``reward scorer 'name' at URL`` (the URL as :func:`shown_url` shows it)."""
    return f"reward scorer {config.name!r} at {shown_url(config.url)}"


def request_headers(config) -> dict[str, str]:
    """The headers every call to the remote carries (``headers`` and ``api_key``; secrets, never logged)."""
    headers = {k: v.get_secret_value() for k, v in config.headers.items()}
    if config.api_key is not None:
        headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
    return headers


class HttpScorer(Scorer):
    """Scores by calling another reward service over HTTP."""

    kind = "http"

    def __init__(self, config, metrics):
        super().__init__(config, metrics)
        self._protocol = PROTOCOLS[config.protocol]
        self._gate = asyncio.Semaphore(config.max_concurrency)
        self._client: httpx.AsyncClient | None = None
        self.breaker = CircuitBreaker(
            config.name, config.breaker_failures, config.breaker_reset_s,
            on_change=lambda is_open: metrics.breaker_open.labels(config.name).set(1 if is_open else 0),
        )

    async def start(self) -> None:
        headers = request_headers(self.config)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s, connect=min(10.0, self.config.timeout_s)),
            limits=httpx.Limits(max_connections=self.config.max_concurrency,
                                max_keepalive_connections=self.config.max_concurrency),
            headers=headers,
        )

    @property
    def where(self) -> str:
        return where(self.config)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def check(self) -> None:
        if self.breaker.is_open:
            raise ScorerUnavailable(f"circuit open (last error: {self.breaker.last_error})")

    def call_timeout(self, n_items: int) -> float:
        chunks = math.ceil(n_items / self.config.max_batch_items)
        waves = math.ceil(chunks / self.config.max_concurrency)
        return self.config.timeout_s * waves + 1.0

    async def score(self, items: Sequence[ScoreItem]) -> list[float]:
        size = self.config.max_batch_items
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        parts = await asyncio.gather(*(self._post(chunk) for chunk in chunks))
        return [v for part in parts for v in part]

    async def _post(self, items: Sequence[ScoreItem]) -> list[float]:
        async with self._gate:
            self.breaker.before_call()
            try:
                values = await self._request(items)
            except ScorerFailure as exc:
                self.breaker.record_failure(exc.message)
                raise
            self.breaker.record_success()
            return values

    async def _request(self, items: Sequence[ScoreItem]) -> list[float]:
        if self._client is None:
            raise RuntimeError(f"{self.where} used before start()")
        try:
            response = await self._client.post(self.config.url, json=self._protocol.payload(items))
        except httpx.TimeoutException as exc:
            raise ScorerTimeout(f"did not answer within {self.config.timeout_s}s ({type(exc).__name__})") from exc
        except httpx.ConnectError as exc:
            raise ScorerUnavailable(f"cannot connect ({short_reason(exc)})") from exc
        except httpx.HTTPError as exc:
            raise ScorerFailure(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            status = response.status_code
            error = ScorerUnavailable if status in (429, 503) else ScorerFailure
            raise error(answered(response), retryable=status >= 500 or status == 429)
        try:
            body = response.json()
        except ValueError as exc:
            raise ScorerFailure(f"the reply is not JSON: {response.text[:200]!r}") from exc
        try:
            return self._protocol.values(body, len(items))
        except ValueError as exc:  # pydantic ValidationError included
            raise ScorerFailure(f"the reply is not what the {self.config.protocol} protocol says: "
                               f"{first_error(exc)}") from exc
