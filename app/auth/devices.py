"""Device cookies: a browser that has logged in to an account before can prove it at the next login.

Per-account rate limits slow down password guessing from many addresses, but they would also let
anyone lock an account's owner out by guessing wrong on purpose. A login that presents this account's
device cookie is counted in that device's own bucket instead of the account's, so spraying an
account never blocks the devices its owner already uses (the device bucket has the same limit, so a
stolen cookie buys no extra guesses).
"""

from __future__ import annotations

import secrets

from flask import current_app, request
from itsdangerous import BadSignature, URLSafeTimedSerializer

DEVICE_COOKIE = "__Secure-device"
DEVICE_PATH = "/auth/login"  # sent with login attempts only
DEVICE_LIFETIME = 365 * 24 * 3600


def _serializer() -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt="device-cookie")


def known_device(user_id: str | None) -> str | None:
    """The id of this request's device cookie when it was issued to `user_id`; None otherwise."""
    raw = request.cookies.get(DEVICE_COOKIE)
    if not raw or not user_id:
        return None
    try:
        claims = _serializer().loads(raw, max_age=DEVICE_LIFETIME)
    except BadSignature:
        return None
    if not isinstance(claims, dict) or claims.get("user") != user_id or not isinstance(claims.get("device"), str):
        return None
    return claims["device"]


def remember_device(response, user_id: str) -> None:
    """After a successful password login: mark this browser as one of the account's devices."""
    if known_device(user_id):
        return
    value = _serializer().dumps({"user": user_id, "device": secrets.token_urlsafe(16)})
    response.set_cookie(
        DEVICE_COOKIE,
        value,
        max_age=DEVICE_LIFETIME,
        path=DEVICE_PATH,
        secure=True,
        httponly=True,
        samesite="Strict",
    )
