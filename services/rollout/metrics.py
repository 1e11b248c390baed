"""Prometheus metrics of the rollout service, on the service's own registry."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.telemetry import LATENCY_BUCKETS, SIZE_BUCKETS

ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/model_info",
          "/metrics", "/pause_generation", "/continue_generation")


class RolloutMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("fleetrl_rollout_requests", "HTTP requests by route and status.", ["route", "status"], registry=r)
        self.latency = Histogram("fleetrl_rollout_request_latency_seconds", "HTTP request latency (whole stream).",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("fleetrl_rollout_time_to_first_token_seconds", "Time to a sequence's first token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("fleetrl_rollout_prompt_tokens", "Prompt tokens of admitted sequences.", registry=r)
        self.generated_tokens = Counter("fleetrl_rollout_generated_tokens", "Tokens generated.", registry=r)
        self.sequences = Counter("fleetrl_rollout_sequences", "Finished sequences by finish reason.", ["finish"], registry=r)
        self.batch_size = Histogram("fleetrl_rollout_batch_size", "Sequences per decode step (hf engine).",
                                    buckets=SIZE_BUCKETS, registry=r)
        self.rejected = Counter("fleetrl_rollout_rejected", "Requests refused for capacity or pause.", ["reason"], registry=r)
        self.queue_depth = Gauge("fleetrl_rollout_queue_depth", "Sequences waiting for a batch slot.", registry=r)
        self.inflight = Gauge("fleetrl_rollout_inflight_sequences", "Sequences admitted and not finished.", registry=r)
        self.weight_version = Gauge("fleetrl_rollout_weight_version", "Weight version the engine generates with.", registry=r)
        self.paused = Gauge("fleetrl_rollout_paused", "1 while generation is paused.", registry=r)

    def bind(self, queue_depth: Callable[[], float], inflight: Callable[[], float],
             weight_version: Callable[[], float], paused: Callable[[], float]) -> None:
        self.queue_depth.set_function(queue_depth)
        self.inflight.set_function(inflight)
        self.weight_version.set_function(weight_version)
        self.paused.set_function(paused)

    @staticmethod
    def route_label(path: str) -> str:
        return path if path in ROUTES else "other"
