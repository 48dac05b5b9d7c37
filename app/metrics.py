"""Prometheus metrics. Under gunicorn every worker writes to PROMETHEUS_MULTIPROC_DIR (set up in
gunicorn.conf.py) and /metrics adds up all workers, so a scrape sees the whole server, not one worker.
A CLI process given the same directory (`make run` writes it to var/.env) adds its counts there too;
counters of processes that have exited stay in the sum."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

OPEN_CONNECTIONS = Gauge(
    "rt_open_connections", "Live connections by transport.", ["transport"], multiprocess_mode="livesum"
)
EVENTS_PUBLISHED = Counter("rt_events_published_total", "Events appended to the bus.")
EVENTS_DELIVERED = Counter("rt_events_delivered_total", "Events written to clients, by transport.", ["transport"])
LOGINS = Counter("auth_logins_total", "Login attempts by result.", ["result"])
REFRESHES = Counter(
    "auth_refreshes_total", "Refresh attempts by outcome (rotated, grace, reused, invalid).", ["outcome"]
)
REQUEST_SECONDS = Histogram(
    "http_request_duration_seconds",
    "Time to answer a request (streams: their whole life), by endpoint.",
    ["method", "endpoint", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
)


def render(multiproc_dir: str | None) -> tuple[bytes, str]:
    """The exposition text: every worker's values when running multi-process."""
    if multiproc_dir:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    return generate_latest(registry), CONTENT_TYPE_LATEST
