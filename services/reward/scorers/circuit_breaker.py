"""A small circuit breaker: after N consecutive failures, refuse calls for a while, then try one."""

from __future__ import annotations

import time
from collections.abc import Callable

from services.reward.errors import CircuitOpen


class CircuitBreaker:
    """closed -> (``failures`` consecutive failures) -> open -> (``reset_s`` later) -> half-open.

    Half-open lets one trial call through: success closes the circuit, failure opens it again.
    """

    def __init__(self, name: str, failures: int, reset_s: float, on_change: Callable[[bool], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.failures = failures
        self.reset_s = reset_s
        self._on_change = on_change
        self._clock = clock
        self._consecutive = 0
        self._opened_at: float | None = None
        self._trial_in_flight = False
        self.last_error = ""

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None and self._clock() - self._opened_at < self.reset_s

    def before_call(self) -> None:
        """Raise CircuitOpen unless a call may go through now."""
        if self._opened_at is None:
            return
        waited = self._clock() - self._opened_at
        if waited < self.reset_s or self._trial_in_flight:
            retry_in = max(0.0, self.reset_s - waited)
            raise CircuitOpen(
                f"circuit open after {self._consecutive} consecutive failures (last: {self.last_error}); "
                f"next trial in {retry_in:.1f}s",
                cause=self.last_error or None,
            )
        self._trial_in_flight = True

    def record_success(self) -> None:
        self._consecutive = 0
        self._trial_in_flight = False
        if self._opened_at is not None:
            self._opened_at = None
            self._on_change(False)

    def record_failure(self, error: str) -> None:
        self._consecutive += 1
        self.last_error = error
        self._trial_in_flight = False
        if self._consecutive >= self.failures:
            was_open = self._opened_at is not None
            self._opened_at = self._clock()
            if not was_open:
                self._on_change(True)
