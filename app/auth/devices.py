"""Known devices: a client that has logged in to an account before can prove it at the next login.

Per-account rate limits slow down password guessing from many addresses, but they would also let
anyone lock an account's owner out by guessing wrong on purpose. A login that proves it comes from one
of this account's devices is counted in that device's own bucket instead of the account's, so spraying
an account never blocks the devices its owner already uses (the device bucket has the same limit, so a
stolen credential buys no extra guesses).

The proof is a signed claim {user, device, ver}: a browser gets it as the `__Secure-device` cookie
(transport `cookie`), an app as `device_token` in the login's answer, which it sends back in the next
login's body (transport `body`). Each is signed with its own salt, so it is good in its own place only,
and neither is good for anything but choosing a rate-limit bucket. `ver` is the account's tokenVersion
when it was issued: a password reset, "log out everywhere" or an account deleted and made again retires
every device the account had, as it does every session.
"""

from __future__ import annotations

import secrets

from flask import current_app, request
from itsdangerous import BadData, URLSafeTimedSerializer

from ..redis import Keys, get_redis

DEVICE_COOKIE = "__Secure-device"
DEVICE_PATH = "/auth/login"  # sent with login attempts (and their MFA step) only
DEVICE_LIFETIME = 365 * 24 * 3600
DEVICE_TOKEN_MAX = 512  # an issued one has about 130 characters; anything much longer is not one of ours
COOKIE, TOKEN = "device-cookie", "device-token"  # the salts: a cookie is no device_token, and the reverse


def _serializer(purpose: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt=purpose)


def _device_of(raw: str | None, purpose: str, user_id: str, token_version: int) -> str | None:
    """The device id `raw` names when it was issued for `purpose` to this account as it is now."""
    if not raw or len(raw) > DEVICE_TOKEN_MAX:
        return None
    try:
        claims = _serializer(purpose).loads(raw, max_age=DEVICE_LIFETIME)
    except BadData:  # a bad or expired signature, or a payload that does not decode
        return None
    if not isinstance(claims, dict) or claims.get("user") != user_id or not isinstance(claims.get("device"), str):
        return None
    version = claims.get("ver")
    if not isinstance(version, int) or isinstance(version, bool) or version != token_version:
        return None  # issued before a reset or "log out everywhere" (or a credential from before `ver` existed)
    return claims["device"]


def _current_version(user_id: str) -> int | None:
    version = get_redis().hget(Keys.user(user_id), "token_version")
    return int(version) if version is not None else None  # None: the account is gone


def known_device(user_id: str | None, device_token: str | None = None, token_version: int | None = None) -> str | None:
    """The id of the device this login comes from, proved by `device_token` (from the body) or the device
    cookie, when that was issued to `user_id` at its current tokenVersion; None otherwise.

    Without `token_version` the stored one is read: one look-up, made only when a credential is presented.
    """
    presented = ((device_token, TOKEN), (request.cookies.get(DEVICE_COOKIE), COOKIE))
    if not user_id or not any(raw for raw, _ in presented):
        return None
    if token_version is None:
        token_version = _current_version(user_id)
        if token_version is None:
            return None
    for raw, purpose in presented:
        device = _device_of(raw, purpose, user_id, token_version)
        if device:
            return device
    return None


def _issue(purpose: str, user: dict) -> str:
    claims = {"user": user["id"], "device": secrets.token_urlsafe(16), "ver": int(user["token_version"])}
    return _serializer(purpose).dumps(claims)


def remember_device(response, user: dict) -> None:
    """After a successful cookie login: mark this browser as one of the account's devices (if not yet)."""
    if _device_of(request.cookies.get(DEVICE_COOKIE), COOKIE, user["id"], int(user["token_version"])):
        return
    response.set_cookie(
        DEVICE_COOKIE,
        _issue(COOKIE, user),
        max_age=DEVICE_LIFETIME,
        path=DEVICE_PATH,
        secure=True,
        httponly=True,
        samesite="Strict",
    )


def device_token(user: dict, presented: str | None) -> str:
    """After a successful body login: the `device_token` for its answer, the one presented while still good."""
    if _device_of(presented, TOKEN, user["id"], int(user["token_version"])):
        return presented
    return _issue(TOKEN, user)
