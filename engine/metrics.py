"""Prometheus metrics of `quantgate serve` (GET /metrics).

Each app gets its own registry, so several servers (or tests) in one process never share
counters. HTTP outcomes are counted by an ASGI middleware that sees every response,
including the 4xx the app itself produces and the 404s of unknown paths; the engine's queue
and running counts are read from the engine at scrape time rather than mirrored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["PROMETHEUS_CONTENT_TYPE", "ServerMetrics", "RequestMetricsMiddleware"]

# Seconds; CPU decoding of a long answer can take minutes, a GPU token a few milliseconds.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)

EngineStats = Callable[[], Mapping[str, float]]  # AsyncEngine.stats
OTHER_ENDPOINT = "other"  # unknown paths share one label so random URLs cannot blow up cardinality


# Prometheus name, help, key of AsyncEngine.stats()
ENGINE_GAUGES = (
    ("quantgate_num_requests_waiting", "Requests queued in the engine, not yet running", "num_waiting"),
    ("quantgate_num_requests_running", "Requests in the engine's running batch", "num_running"),
    ("quantgate_kv_cache_slots", "Sequence slots of the KV cache", "kv_slots"),
    ("quantgate_kv_cache_slots_used", "KV cache slots held by requests", "kv_slots_used"),
)


class _EngineGaugeCollector(Collector):
    """Reads the engine's counts when Prometheus scrapes."""

    def __init__(self, read: EngineStats) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        stats = self._read()
        for name, help_text, key in ENGINE_GAUGES:
            if key in stats:
                yield GaugeMetricFamily(name, help_text, value=stats[key])


class ServerMetrics:
    def __init__(self, engine_stats: EngineStats) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("quantgate_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("quantgate_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("quantgate_generation_tokens", "Generated tokens", registry=r)
        self.request_latency = Histogram("quantgate_request_latency_seconds",
                                         "Time from request received to last response byte",
                                         ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.time_to_first_token = Histogram("quantgate_time_to_first_token_seconds",
                                             "Time from request accepted to its first generated token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.time_per_output_token = Histogram("quantgate_time_per_output_token_seconds",
                                               "Mean time per generated token after the first, per request",
                                               buckets=TOKEN_LATENCY_BUCKETS, registry=r)
        r.register(_EngineGaugeCollector(engine_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetricsMiddleware:
    """Counts every HTTP response by endpoint and status and times it to its last byte
    (a pure ASGI middleware, so streamed responses and disconnects are seen as they happen)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, endpoints: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in self.endpoints else OTHER_ENDPOINT
        start = time.perf_counter()
        status = "disconnected"  # a client gone before the response started

        async def observe(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observe)
        except BaseException:
            if status == "disconnected":
                status = "500"
            raise
        finally:
            self.metrics.requests.labels(endpoint, status).inc()
            self.metrics.request_latency.labels(endpoint).observe(time.perf_counter() - start)
