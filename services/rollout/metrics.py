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

    def bind_prefix_cache(self, stats: Callable[[], object], held: Callable[[], tuple[int, int]]) -> None:
        """Expose an engine's prefix cache (hf): ``stats()`` its counters, ``held()`` (entries, tokens)."""
        self.registry.register(_PrefixCacheCollector(stats, held))

    @staticmethod
    def route_label(path: str) -> str:
        return path if path in ROUTES else "other"


class _PrefixCacheCollector:
    """Counters and gauges read from the engine's prefix cache at scrape time."""

    COUNTERS = (
        ("lookups", "Prompts looked up in the prefix cache."),
        ("hits", "Prompts that found a cached prefix."),
        ("hit_tokens", "Prompt tokens not prefilled thanks to the prefix cache."),
        ("prompt_tokens", "Prompt tokens of the sequences looked up."),
        ("evicted", "Prefix cache entries evicted to stay within prefix_cache_tokens."),
        ("invalidations", "Times the prefix cache was emptied (weight version set, generation resumed)."),
    )

    def __init__(self, stats: Callable[[], object], held: Callable[[], tuple[int, int]]) -> None:
        self._stats, self._held = stats, held

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self._stats()
        for name, doc in self.COUNTERS:
            yield CounterMetricFamily(f"fleetrl_rollout_prefix_cache_{name}", doc, value=getattr(stats, name))
        entries, tokens = self._held()
        yield GaugeMetricFamily("fleetrl_rollout_prefix_cache_entries", "Sequences held in the prefix cache.", value=entries)
        yield GaugeMetricFamily("fleetrl_rollout_prefix_cache_tokens", "Token positions held in the prefix cache.",
                                value=tokens)
