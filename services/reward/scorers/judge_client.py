"""One judge endpoint: OpenAI-compatible ``POST /v1/chat/completions`` with a concurrency limit, a timeout on
every call, a circuit breaker and the run's budget (calls and tokens).

The ``api_key`` and header values are secrets: sent, never logged; errors name the endpoint by scheme, host and
path only. Tokens are counted from the reply's ``usage`` (``total_tokens``, else prompt + completion); a reply
without ``usage`` is counted as (characters sent + received) / 4.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from services.reward.errors import ScorerFailure, ScorerTimeout, ScorerUnavailable
from services.reward.metrics import RewardMetrics
from services.reward.scorers.circuit_breaker import CircuitBreaker
from services.reward.scorers.http_remote import shown_url


class BudgetSpent(ScorerUnavailable):
    """The run's judge budget is spent: no more judge calls (not retried)."""

    retryable = False


class Budget:
    """Calls and tokens spent on the judge in this service's life, against ``budget.max_calls`` /
    ``budget.max_tokens``. A call is counted when it starts; tokens when its reply comes."""

    def __init__(self, scorer: str, max_calls: int | None, max_tokens: int | None):
        self.scorer, self.max_calls, self.max_tokens = scorer, max_calls, max_tokens
        self.calls = 0
        self.tokens = 0

    def spent(self) -> str | None:
        """Why no call may start now (naming the setting), or None."""
        if self.max_calls is not None and self.calls >= self.max_calls:
            return (f"judge budget spent: {self.calls} calls made, budget.max_calls is {self.max_calls} (scorer "
                    f"{self.scorer!r}); raise budget.max_calls to judge more")
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return (f"judge budget spent: {self.tokens} tokens used, budget.max_tokens is {self.max_tokens} (scorer "
                    f"{self.scorer!r}); raise budget.max_tokens to judge more")
        return None

    def take_call(self) -> None:
        """Count one call, or raise :class:`BudgetSpent`."""
        reason = self.spent()
        if reason is not None:
            raise BudgetSpent(reason)
        self.calls += 1


def endpoint_of(url: str) -> str:
    """The endpoint a judge URL names, for sharing its concurrency limit: scheme, host (any case) and port (the
    scheme's default when unset) and path; the query, user info and a trailing slash are not part of it."""
    u = httpx.URL(url)
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return f"{u.scheme}://{u.host.lower()}:{port}{u.path.rstrip('/') or '/'}"


def usage_tokens(body: dict, sent_chars: int, text: str) -> int:
    """Tokens a reply says it cost (``usage``), else an estimate from characters."""
    usage = body.get("usage")
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if isinstance(total, int) and total >= 0:
            return total
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and prompt >= 0 and isinstance(completion, int) and completion >= 0:
            return prompt + completion
    return (sent_chars + len(text)) // 4


class JudgeClient:
    """Chat calls to one judge endpoint (one per judge scorer). Its concurrency gate is the endpoint's: the reward
    service hands every judge scorer of one endpoint the same gate (:meth:`share_gate`)."""

    def __init__(self, config, metrics: RewardMetrics):
        self.config = config
        self.metrics = metrics
        self.url = shown_url(config.url)
        self.endpoint = endpoint_of(config.url)
        self.limit = config.max_concurrency
        self.gate = asyncio.Semaphore(config.max_concurrency)
        self.budget = Budget(config.name, config.budget.max_calls, config.budget.max_tokens)
        self.breaker = CircuitBreaker(
            config.name, config.breaker_failures, config.breaker_reset_s,
            on_change=lambda is_open: metrics.breaker_open.labels(config.name).set(1 if is_open else 0))
        self._client: httpx.AsyncClient | None = None
        s = config.sampling
        self._sampling: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens}
        if s.seed is not None:
            self._sampling["seed"] = s.seed
        if s.stop:
            self._sampling["stop"] = list(s.stop)

    def share_gate(self, gate: asyncio.Semaphore, limit: int) -> None:
        """Take the endpoint's gate (``limit`` calls in flight), shared with the other scorers that call it."""
        self.gate, self.limit = gate, limit

    async def start(self) -> None:
        headers = {k: v.get_secret_value() for k, v in self.config.headers.items()}
        if self.config.api_key is not None:
            headers["Authorization"] = f"Bearer {self.config.api_key.get_secret_value()}"
        n = self.config.max_concurrency
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s, connect=min(10.0, self.config.timeout_s)),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n), headers=headers)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def problem(self) -> str | None:
        """Why this judge cannot judge now (open circuit, spent budget), or None."""
        if self.breaker.is_open:
            return f"circuit open (last error: {self.breaker.last_error})"
        return self.budget.spent()

    async def chat(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply text to ``messages`` (one call, within the concurrency limit and the budget)."""
        name = self.config.name
        async with self.gate:
            self.breaker.before_call()
            try:
                self.budget.take_call()
            except BudgetSpent:
                self.metrics.judge_calls.labels(name, "refused").inc()
                raise
            self.metrics.judge_in_flight.labels(name).inc()
            try:
                text, tokens = await self._post(messages)
            except ScorerFailure as exc:
                self.metrics.judge_calls.labels(name, "error").inc()
                self.breaker.record_failure(exc.message)
                raise
            finally:
                self.metrics.judge_in_flight.labels(name).dec()
            self.breaker.record_success()
            self.budget.tokens += tokens
            self.metrics.judge_tokens.labels(name).inc(tokens)
            self.metrics.judge_calls.labels(name, "answered").inc()
            return text

    async def _post(self, messages: list[dict[str, str]]) -> tuple[str, int]:
        payload = {"model": self.config.model, "messages": messages, **self._sampling}
        if self._client is None:
            raise RuntimeError(f"judge client {self.url} used before start()")
        try:
            response = await self._client.post(self.config.url, json=payload)
        except httpx.TimeoutException as exc:
            raise ScorerTimeout(f"judge {self.url} did not answer within {self.config.timeout_s}s "
                                f"({type(exc).__name__})") from exc
        except httpx.ConnectError as exc:
            raise ScorerUnavailable(f"cannot connect to judge {self.url}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ScorerFailure(f"judge {self.url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            status = response.status_code
            error = ScorerUnavailable if status in (429, 503) else ScorerFailure
            raise error(f"judge {self.url} answered {status}: {response.text[:300]}",
                        retryable=status >= 500 or status == 429)
        try:
            body = response.json()
            text = body["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ScorerFailure(f"judge {self.url} answered without choices[0].message.content: "
                                f"{response.text[:200]!r}") from exc
        if not isinstance(text, str):
            raise ScorerFailure(f"judge {self.url} answered content {type(text).__name__}, not text")
        sent = sum(len(m["content"]) for m in messages)
        return text, usage_tokens(body, sent, text)
