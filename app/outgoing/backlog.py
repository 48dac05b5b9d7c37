"""Per-endpoint backlog for /metrics, read from Redis at scrape time (the same whichever worker answers)."""

from __future__ import annotations

import logging
import time

import redis
from flask import current_app
from prometheus_client.core import GaugeMetricFamily

from ..redis import Outage

log = logging.getLogger(__name__)


class BacklogCollector:
    """Messages pending per endpoint, the age of the oldest, and events not yet matched to endpoints."""

    def __init__(self, store):
        self.store = store
        self.outage: Outage | None = None

    def collect(self):
        """The gauges, or none while Redis is away (a scrape must not fail for it; the log tells it once)."""
        try:
            rows, feed = self.store.backlog()
        except redis.exceptions.RedisError as error:
            self._outage().failed(error)
            return
        self._outage().succeeded()
        now = time.time()
        backlog = GaugeMetricFamily(
            "rt_webhook_backlog",
            "Outgoing webhook messages not yet delivered or failed, per endpoint.",
            labels=["endpoint"],
        )
        oldest = GaugeMetricFamily(
            "rt_webhook_oldest_pending_seconds",
            "Age of the oldest pending message, per endpoint (0 when none).",
            labels=["endpoint"],
        )
        for endpoint_id, count, created in rows:
            backlog.add_metric([endpoint_id], count)
            oldest.add_metric([endpoint_id], max(0.0, now - created) if created else 0.0)
        yield backlog
        yield oldest
        yield GaugeMetricFamily(
            "rt_webhook_feed_backlog", "Published events not yet matched against the endpoints.", value=feed
        )

    def _outage(self) -> Outage:
        """Scrapes that found no Redis, told once an outage (a scraper asks every few seconds); made at the first
        scrape, which runs in the app's context (its settings say where Redis is)."""
        if self.outage is None:
            self.outage = Outage(log, "metrics: outgoing webhook backlog", current_app.config["SETTINGS"].redis_url)
        return self.outage
