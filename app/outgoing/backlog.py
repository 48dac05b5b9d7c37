"""Per-endpoint backlog for /metrics, read from Redis at scrape time (the same whichever worker answers)."""

from __future__ import annotations

import logging
import time

import redis
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)


class BacklogCollector:
    """Messages pending per endpoint, the age of the oldest, and events not yet matched to endpoints."""

    def __init__(self, store):
        self.store = store

    def collect(self):
        """The gauges, or none while Redis is away (a scrape must not fail for it)."""
        try:
            rows, feed = self.store.backlog()
        except redis.exceptions.RedisError as error:
            log.warning("metrics: outgoing webhook backlog unavailable (%s)", type(error).__name__)
            return
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
