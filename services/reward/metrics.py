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
        self.judge_calls = Counter(
            "fleetrl_reward_judge_calls", "Judge calls by outcome: answered, error, refused (budget spent).",
            ["scorer", "outcome"], registry=r,
        )
        self.judge_unreadable = Counter(
            "fleetrl_reward_judge_unreadable", "Judge replies the parser could not read (each is asked again up to "
            "max_retries).", ["scorer"], registry=r,
        )
        self.judge_tokens = Counter(
            "fleetrl_reward_judge_tokens", "Tokens the judge's replies say they cost (budget.max_tokens counts these).",
            ["scorer"], registry=r,
        )
        self.judge_in_flight = Gauge(
            "fleetrl_reward_judge_in_flight", "Judge calls waiting for their reply.", ["scorer"], registry=r
        )
        self.judge_cache = Counter(
            "fleetrl_reward_judge_cache", "Judgments looked up in the cache: hit or miss.", ["scorer", "result"],
            registry=r,
        )
        self.judge_dedup_saved = Counter(
            "fleetrl_reward_judge_dedup_saved", "Judgments not asked for because the same work was in the batch or "
            "in flight (group mode: duplicate responses left out of a group's call).", ["scorer"], registry=r,
        )
        self.requests = Counter(
            "fleetrl_reward_requests", "HTTP scoring requests by route and status.", ["route", "status"], registry=r
        )
        self.request_items = Histogram(
            "fleetrl_reward_request_items", "Items per scoring request.", ["route"], buckets=SIZE_BUCKETS, registry=r
        )
