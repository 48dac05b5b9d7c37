"""Prometheus metrics. Under gunicorn every worker writes to PROMETHEUS_MULTIPROC_DIR (set up in
gunicorn.conf.py) and /metrics adds up all workers, so a scrape sees the whole server, not one worker.
A CLI process given the same directory (`make run` writes it to var/.env) adds its counts there too;
counters of processes that have exited stay in the sum.

Who may read them is decided here, for the web process's /metrics and the delivery process's alike:
a client address in METRICS_ALLOW_IPS (default loopback), or `Authorization: Bearer <METRICS_TOKEN>`.
Anyone else gets a 404, as if there were nothing there, with or without a proxy in front."""

from __future__ import annotations

import glob
import hmac
import logging
import os

from flask import Flask, current_app
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

from .http import ip_address

OPEN_CONNECTIONS = Gauge(
    "rt_open_connections", "Live connections by transport.", ["transport"], multiprocess_mode="livesum"
)
EVENTS_PUBLISHED = Counter("rt_events_published_total", "Events appended to the bus.")
EVENTS_DELIVERED = Counter("rt_events_delivered_total", "Events written to clients, by transport.", ["transport"])
LOGINS = Counter("auth_logins_total", "Login attempts by result.", ["result"])
REFRESHES = Counter(
    "auth_refreshes_total", "Refresh attempts by outcome (rotated, grace, reused, ended, invalid).", ["outcome"]
)
REQUEST_SECONDS = Histogram(
    "http_request_duration_seconds",
    "Time to answer a request (streams: their whole life), by endpoint.",
    ["method", "endpoint", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
)


# Outgoing webhooks: counted by the delivery process (`worker:`), which writes to the same directory.
WEBHOOK_MESSAGES = Counter(
    "rt_webhook_messages_total",
    "Outgoing webhook messages by what became of them (created, delivered, failed).",
    ["outcome"],
)
WEBHOOK_ATTEMPTS = Counter(
    "rt_webhook_attempts_total",
    "Outgoing webhook attempts by result (success, http_error, redirect, timeout, refused, connection_error).",
    ["result"],
)
WEBHOOK_ATTEMPT_SECONDS = Histogram(
    "rt_webhook_attempt_duration_seconds",
    "Time an outgoing webhook attempt took, to its answer or its failure.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30),
)


def render(multiproc_dir: str | None) -> tuple[bytes, str]:
    """The exposition text: every worker's values when running multi-process, and the values features
    read from Redis at scrape time (their collectors in app.extensions["metrics_collectors"])."""
    collectors = current_app.extensions.get("metrics_collectors", ()) if current_app else ()
    if multiproc_dir:
        registry = CollectorRegistry()
        _WrittenFilesOnly(registry, path=multiproc_dir)
    else:
        registry = CollectorRegistry()
        registry.register(_Everything())
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _WrittenFilesOnly(multiprocess.MultiProcessCollector):
    """Every process's values, without the files still being made.

    prometheus_client creates a process's file and sizes it a moment later. A scrape in that moment read
    an empty file and failed as a whole, every other process's values with it. An empty file holds
    nothing yet; one removed meanwhile (a dead worker's gauges) holds nothing any more.
    """

    def collect(self):
        """The merged values of the files that have something in them."""
        return self.merge([path for path in glob.glob(os.path.join(self._path, "*.db")) if _written(path)], True)


def _written(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except FileNotFoundError:
        return False


class _Everything:
    """This process's own metrics, as one collector that can sit in a registry beside others."""

    def collect(self):
        """Everything the default registry holds."""
        return REGISTRY.collect()


def scrape_allowed(client_address: str | None, authorization: str | None) -> bool:
    """Whether this client may read the metrics: an allowed address, or the metrics token as a bearer."""
    settings = current_app.config["SETTINGS"]
    token = settings.metrics_token
    scheme, _, presented = (authorization or "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode()):
        return True
    address = ip_address(client_address)
    return address is not None and any(address in network for network in settings.metrics_allow_ips)


NOT_FOUND = b'{"error": {"code": "not_found", "message": "Not found."}}'


def metrics_only_app(app: Flask):
    """A WSGI app that serves GET /metrics (as the web process does, under the same access rule) and nothing
    else: what the delivery process listens with, so its counters can be scraped where it runs alone."""

    def serve(environ, start_response):
        with app.app_context():
            allowed = environ.get("PATH_INFO") == "/metrics" and environ.get("REQUEST_METHOD") in ("GET", "HEAD")
            if allowed and scrape_allowed(environ.get("REMOTE_ADDR"), environ.get("HTTP_AUTHORIZATION")):
                body, content_type = render(app.config["SETTINGS"].prometheus_multiproc_dir)
                start_response("200 OK", [("Content-Type", content_type), ("Cache-Control", "no-store")])
                return [body]
        start_response("404 Not Found", [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
        return [NOT_FOUND]

    return serve


def serve_worker_metrics(app: Flask):
    """Serve the process's /metrics on 0.0.0.0:WORKER_METRICS_PORT (as gunicorn binds $PORT) in a greenlet of
    its own; the access rule above applies. Returns the started server, or None when the port is unset."""
    from gevent.pywsgi import WSGIServer

    port = app.config["SETTINGS"].worker_metrics_port
    if not port:
        return None
    server = WSGIServer(("0.0.0.0", port), metrics_only_app(app), log=None, error_log=logging.getLogger(__name__))
    server.start()
    logging.getLogger(__name__).info("metrics on port %s", port)
    return server
