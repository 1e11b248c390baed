"""Logging and Prometheus helpers shared by the services.

Each service object owns a ``CollectorRegistry`` (not the process-global one), so several apps can
live in one test process without metric-name clashes.
"""

from __future__ import annotations

import logging
import sys

from fastapi import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

# Buckets suited to LLM serving latencies (seconds).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def setup_logging(level: str = "INFO", service: str = "fleetrl") -> logging.Logger:
    """Plain, greppable logs on stderr: time, level, service, logger, message."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(service)


class PrometheusText(Response):
    """``GET /metrics``: Prometheus' text exposition format (``response_class=PrometheusText`` declares it in
    the OpenAPI spec as ``text/plain``, with no JSON schema)."""

    media_type = "text/plain"


def metrics_response(registry: CollectorRegistry) -> PrometheusText:
    """The body of a ``GET /metrics`` route."""
    return PrometheusText(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
