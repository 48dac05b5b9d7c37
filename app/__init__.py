"""The application factory: the only place settings are read and extensions bound."""

from __future__ import annotations

import logging

from flask import Flask

from . import cli, errors, events, limits, logs, ops, page, webhooks
from . import redis as redis_ext
from .auth import guards, oauth, tokens
from .auth import views as auth_views
from .proxy import TrustedProxyFix
from .settings import load_settings

JSON_BODY_LIMIT = 64 * 1024


def create_app(overrides: dict | None = None) -> Flask:
    """Build the app from the environment; `overrides` (environment-style names) win, for tests."""
    settings = load_settings(overrides)
    app = Flask(__name__)
    app.config.update(
        SETTINGS=settings,
        SECRET_KEY=str(settings.secret_key),
        MAX_CONTENT_LENGTH=JSON_BODY_LIMIT,
        JSON_SORT_KEYS=False,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.proxy_hops:
        app.wsgi_app = TrustedProxyFix(app.wsgi_app, settings.proxy_hops, settings.forwarded_allow_ips)

    errors.init_app(app)
    logs.init_app(app)
    redis_ext.init_app(app)
    tokens.init_app(app)
    guards.init_app(app)
    app.register_blueprint(ops.bp)
    app.register_blueprint(auth_views.bp)
    app.register_blueprint(auth_views.jwks_bp)
    oauth.init_app(app)
    events.init_app(app)
    webhooks.init_app(app)
    page.init_app(app)
    limits.init_app(app)  # after every blueprint: it applies the limits their views declare
    cli.init_app(app)
    app.after_request(_no_store_by_default)
    return app


def _no_store_by_default(response):
    """API answers carry tokens or personal data: no cache keeps them unless a view says otherwise."""
    if response.mimetype == "application/json":
        response.headers.setdefault("Cache-Control", "no-store")
    return response
