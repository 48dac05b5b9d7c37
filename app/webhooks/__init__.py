"""Webhooks received from outside systems: verified, de-duplicated, recorded, then published."""

from __future__ import annotations

from flask import Flask

from .store import DeliveryStore


def init_app(app: Flask) -> None:
    """Bind the configured webhook providers and the delivery store."""
    app.extensions["webhook_providers"] = {p.name: p for p in app.config["SETTINGS"].webhook_providers}
    app.extensions["webhook_store"] = DeliveryStore(
        app.extensions["redis"],
        app.extensions["event_bus"],
        tuple(app.extensions["webhook_providers"]),
        redis_url=app.config["SETTINGS"].redis_url,
    )


def start_background_tasks(app: Flask) -> None:
    """Start the sweeper that retries unpublished deliveries (called once per gunicorn worker)."""
    app.extensions["webhook_store"].ensure_sweeper()
