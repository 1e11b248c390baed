"""Prometheus metrics of the reward service (its own registry, never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.telemetry import LATENCY_BUCKETS, SIZE_BUCKETS


class RewardMetrics:
    """Per-scorer latency, items, errors, retries; batch sizes of batched models; requests by route."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scorer_latency = Histogram(
            "fleetrl_reward_scorer_latency_seconds", "Latency of one scorer call (one try).",
            ["scorer", "kind"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.scorer_items = Counter(
            "fleetrl_reward_scorer_items", "Items scored successfully.", ["scorer", "kind"], registry=r
        )
        self.scorer_errors = Counter(
            "fleetrl_reward_scorer_errors", "Failed scorer calls (each try).", ["scorer", "kind", "error"], registry=r
        )
        self.scorer_retries = Counter(
            "fleetrl_reward_scorer_retries", "Scorer calls retried.", ["scorer", "kind"], registry=r
        )
        self.marked_items = Counter(
            "fleetrl_reward_marked_items", "Items answered with an error marker (on_error: mark).",
            ["scorer"], registry=r,
        )
        self.batch_size = Histogram(
            "fleetrl_reward_batch_size", "Sequences per forward pass of a batched model.",
            ["scorer"], buckets=SIZE_BUCKETS, registry=r,
        )
        self.breaker_open = Gauge(
            "fleetrl_reward_circuit_open", "1 while the scorer's circuit breaker is open.", ["scorer"], registry=r
        )
        self.python_workers_replaced = Counter(
            "fleetrl_reward_python_workers_replaced", "Worker processes of python scorers killed (a call past its "
            "timeout) or found dead, and replaced.", ["scorer"], registry=r,
        )
        self.requests = Counter(
            "fleetrl_reward_requests", "HTTP scoring requests by route and status.", ["route", "status"], registry=r
        )
        self.request_items = Histogram(
            "fleetrl_reward_request_items", "Items per scoring request.", ["route"], buckets=SIZE_BUCKETS, registry=r
        )
