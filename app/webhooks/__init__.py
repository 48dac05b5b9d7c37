"""Webhooks received from outside systems: verified, de-duplicated, recorded, then published."""

from __future__ import annotations

from flask import Flask

from ..settings import SettingsError
from .schemes import VERIFIERS, standard_key
from .store import DeliveryStore
from .views import WebhookProvider


def _providers(env: dict) -> dict[str, WebhookProvider]:
    providers = {}
    for name in [n.strip().lower() for n in env.get("WEBHOOK_PROVIDERS", "").split(",") if n.strip()]:
        prefix = f"WEBHOOK_{name.upper()}_"
        scheme = (env.get(prefix + "SCHEME") or "").strip()
        if scheme not in VERIFIERS:
            raise SettingsError(f"{prefix}SCHEME must be one of {', '.join(VERIFIERS)}")
        # Several secrets, separated by spaces or commas, are all accepted (rotation).
        secrets = [s for s in (env.get(prefix + "SECRET") or "").replace(",", " ").split() if s]
        if not secrets:
            raise SettingsError(f"{prefix}SECRET is required")
        if scheme == "standard":
            for secret in secrets:
                try:
                    standard_key(secret)
                except ValueError as error:
                    raise SettingsError(f"{prefix}SECRET: {error}") from None
        providers[name] = WebhookProvider(name, scheme, secrets, (env.get(prefix + "USER_PATH") or "").strip() or None)
    return providers


def init_app(app: Flask) -> None:
    """Bind the configured webhook providers and the delivery store."""
    app.extensions["webhook_providers"] = _providers(app.config["SETTINGS"].environ)
    app.extensions["webhook_store"] = DeliveryStore(app.extensions["redis"], app.extensions["event_bus"])


def start_background_tasks(app: Flask) -> None:
    """Start the sweeper that retries unpublished deliveries (called once per gunicorn worker)."""
    app.extensions["webhook_store"].ensure_sweeper()
