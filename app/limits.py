"""Rate limits (Flask-Limiter, counted in Redis), declared at each view with `@rate_limited`.

Every limited endpoint is counted per client address and per the account it names, each in its own
bucket: spraying one password over many accounts hits the address bucket, guessing one account's
password from many addresses hits the account's. A login from a device the account already used is
counted per device instead (see `auth/devices.py`), so guesses cannot lock the owner out. An IPv6
client is counted by its /64: one subscriber is routinely given a whole /64 and may use any address in it.

Publishing is limited per user (`PublishLimit`, RATE_LIMIT_PUBLISH), by the event bus itself: every way a
user publishes (POST /events, a batch, a WebSocket frame) goes through it. The same binding sets how long a
channel's history outlives its last publication (EVENT_HISTORY_TTL_SECONDS): channel names are free to make
up, and neither limit alone keeps what users push into Redis bounded.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from urllib.parse import parse_qsl, unquote, urlsplit

from flask import Flask, g, request
from flask_limiter import Limiter
from limits import parse as parse_limit
from limits.strategies import MovingWindowRateLimiter

from .auth import cookies, devices, mfa, passkeys
from .auth.guards import authenticate
from .auth.users import find_user_id_by_email
from .errors import ApiError
from .http import ip_address, json_body


def _body_field(name: str) -> str:
    try:
        value = json_body(optional=True).get(name)
    except ApiError:
        return ""  # the view answers the bad body itself
    return value if isinstance(value, str) else ""


def _email_key() -> str:
    return "account:" + _body_field("email").strip().lower()


def _client_address_key() -> str:
    """The client's address (the peer, or the client a trusted proxy names): an IPv4 address as it is,
    an IPv6 address as its /64 network, an IPv4-mapped IPv6 address as the IPv4 address it maps."""
    remote = request.remote_addr or "127.0.0.1"  # no address: a Unix socket, so a local client
    address = ip_address(remote)
    if address is None:
        return remote
    if address.version == 6:
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _email_or_device_key() -> str:
    """The device's own bucket when it proves it has logged in to this account before."""
    email, device_token = _body_field("email"), _body_field("device_token")
    if email and (device_token or request.cookies.get(devices.DEVICE_COOKIE)):
        device = devices.known_device(find_user_id_by_email(email), device_token)
        if device:
            return "device:" + device
    return _email_key()


def _refresh_token_key() -> str:
    raw = _body_field("refresh_token") or request.cookies.get(cookies.REFRESH_COOKIE) or ""
    return "token:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


def _mfa_token_key() -> str:
    return "mfa:" + hashlib.sha256(_body_field("mfa_token").encode()).hexdigest()[:32]


def _mfa_account_key() -> str:
    """The account a pending MFA login belongs to: guesses count against it across mfa_tokens."""
    user_id = mfa.login_user_id(_body_field("mfa_token")) if _body_field("mfa_token") else None
    return "user:" + user_id if user_id else "mfa:unknown"


def _caller_key() -> str:
    try:
        return "user:" + authenticate().user_id
    except ApiError:
        return "unauthenticated"  # the view answers 401


KEYS = {
    "address": _client_address_key,
    "email": _email_key,
    "email_or_device": _email_or_device_key,
    "refresh_token": _refresh_token_key,
    "caller": _caller_key,
    "mfa_token": _mfa_token_key,
    "mfa_account": _mfa_account_key,
    "passkey_account": passkeys.rate_limit_account,
}


def rate_limited(name: str, per: tuple[str, ...]):
    """Declare at a view that RATE_LIMIT_<NAME> applies to it, counted separately per each of `per`."""
    unknown = set(per) - set(KEYS)
    if unknown:
        raise ValueError(f"unknown rate-limit keys: {', '.join(sorted(unknown))}")

    def mark(view):
        view.rate_limit = (name, per)
        return view

    return mark


def limiter_storage(redis_url: str, mode: str) -> tuple[str, dict]:
    """The `limits` storage URI and options for the app's Redis.

    On a cluster, `limits` wants `redis+cluster://host:port,host:port`; the app's seeds are
    comma-separated `redis://` (or `rediss://`) URLs, whose credentials and TLS are the first seed's
    (passed as options: `limits` would not decode a percent-encoded password in the URI).
    """
    options: dict = {"socket_connect_timeout": 3}
    if mode != "cluster":
        return redis_url, options
    seeds = [urlsplit(seed.strip()) for seed in redis_url.split(",") if seed.strip()]
    first = seeds[0]
    if first.username:
        options["username"] = unquote(first.username)
    if first.password:
        options["password"] = unquote(first.password)
    if first.scheme == "rediss":
        options["ssl"] = True
        cert_reqs = dict(parse_qsl(first.query)).get("ssl_cert_reqs")
        if cert_reqs:
            options["ssl_cert_reqs"] = cert_reqs
    return "redis+cluster://" + ",".join(f"{seed.hostname}:{seed.port or 6379}" for seed in seeds), options


def _retry_after_on_refusals_only(response):
    """Flask-Limiter puts the seconds until its window resets in Retry-After on every answer of a limited
    endpoint; on a 200 that reads as "come back later". The X-RateLimit-* headers already say it there.
    An error the app answered itself keeps the Retry-After it gave, or none (429 mfa_locked: waiting
    does not help)."""
    if response.status_code < 400:
        response.headers.pop("Retry-After", None)
    elif "answered_retry_after" in g:
        response.headers.pop("Retry-After", None)
        if g.answered_retry_after is not None:
            response.headers["Retry-After"] = g.answered_retry_after
    return response


class PublishLimit:
    """RATE_LIMIT_PUBLISH: how many events a user (not an admin; API keys publish without a user) may publish
    in a rolling window, counted in Redis (one key per user, so one hash slot on a cluster). A publication
    is counted whole or refused whole, and what is refused counts nothing."""

    def __init__(self, storage, limit: str):
        self.item = parse_limit(limit)
        self.window = MovingWindowRateLimiter(storage)

    def take(self, user_id: str, count: int) -> None:
        """Count `count` events of the user's, or raise 429 (counting nothing) if they would pass the limit."""
        if self.window.hit(self.item, "publish", user_id, cost=count):
            return
        if count > self.item.amount:
            message = f"At most {self.item.amount} events may be published at once ({self.item})."
        else:
            message = f"Too many events published ({self.item}); retry later."
        raise ApiError(429, "rate_limited", message, {"Retry-After": str(self.retry_after(user_id))})

    def retry_after(self, user_id: str) -> int:
        """Whole seconds until the oldest event counted leaves the window (at least 1)."""
        reset_at = self.window.get_window_stats(self.item, "publish", user_id).reset_time
        return max(1, math.ceil(reset_at - time.time()))


def bind_publishing_limits(app: Flask, limiter: Limiter) -> None:
    """The event bus's limit on what users publish: RATE_LIMIT_PUBLISH, counted in the limiter's storage
    (unless RATE_LIMITS_ENABLED=false: then the limiter has none)."""
    settings, bus = app.config["SETTINGS"], app.extensions["event_bus"]
    if settings.rate_limits_enabled:
        bus.publish_limit = PublishLimit(limiter.storage, settings.rate_limit_publish)


def init_app(app: Flask) -> None:
    """Bind a limiter to this app and apply every limit its views declare (call after all blueprints)."""
    settings = app.config["SETTINGS"]
    storage_uri, storage_options = limiter_storage(settings.redis_url, settings.redis_mode)
    app.after_request(_retry_after_on_refusals_only)  # registered before the limiter's, so it runs after it
    limiter = Limiter(
        key_func=_client_address_key,
        app=app,
        storage_uri=storage_uri,
        storage_options=storage_options,
        strategy="moving-window",
        headers_enabled=True,
        retry_after="delta-seconds",
        key_prefix="ratelimit",
        enabled=settings.rate_limits_enabled,
    )
    for endpoint, view in list(app.view_functions.items()):
        declared = getattr(view, "rate_limit", None)
        if declared is None:
            continue
        name, per = declared
        limit = getattr(settings, f"rate_limit_{name}")
        for kind in per:
            view = limiter.limit(limit, key_func=KEYS[kind], scope=f"{endpoint}:{kind}")(view)
        app.view_functions[endpoint] = view
    app.extensions["rate_limiter"] = limiter
    bind_publishing_limits(app, limiter)
