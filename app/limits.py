"""Rate limits (Flask-Limiter, counted in Redis) on login, register and refresh: per address and per account."""

from __future__ import annotations

import hashlib

from flask import Flask, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

from .auth import cookies


def _account_key() -> str:
    """The account a login or register names; refresh is keyed by its token (its account is unknown yet)."""
    body = request.get_json(silent=True) if request.mimetype == "application/json" else None
    body = body if isinstance(body, dict) else {}
    if request.endpoint == "auth.refresh":
        raw = body.get("refresh_token") or request.cookies.get(cookies.REFRESH_COOKIE) or ""
        return "token:" + hashlib.sha256(str(raw).encode()).hexdigest()[:32]
    return "account:" + str(body.get("email", "")).strip().lower()


def init_app(app: Flask) -> None:
    """Bind a limiter to this app and wrap its rate-limited views (per app, so tests can make several)."""
    settings = app.config["SETTINGS"]
    limiter = Limiter(
        key_func=get_remote_address,  # request.remote_addr, already corrected by ProxyFix
        app=app,
        storage_uri=settings.redis_url,
        storage_options={"socket_connect_timeout": 3},
        strategy="moving-window",
        headers_enabled=True,
        retry_after="delta-seconds",
        key_prefix="ratelimit",
        enabled=settings.rate_limits_enabled,
    )
    for endpoint, limit in (
        ("auth.login", settings.rate_limit_login),
        ("auth.register", settings.rate_limit_register),
        ("auth.refresh", settings.rate_limit_refresh),
    ):
        view = app.view_functions[endpoint]
        view = limiter.limit(limit, key_func=_account_key, scope=f"{endpoint}:account")(view)
        view = limiter.limit(limit, scope=f"{endpoint}:address")(view)
        app.view_functions[endpoint] = view
    app.extensions["rate_limiter"] = limiter
