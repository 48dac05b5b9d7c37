"""`T`, the answer of every way of logging in (password, MFA, passkey, refresh, a trusted issuer's token
exchange), and the name a session's device is given: one place, so that every way answers alike."""

from __future__ import annotations

from flask import current_app, jsonify, make_response, request

from ..http import has_control_characters
from . import cookies, tokens, users


def token_response(
    user: dict,
    session_id: str,
    role: str,
    token_version: int,
    refresh_token: str,
    transport: str,
    device_token: str | None = None,
    extra: dict | None = None,
):
    """`T` in docs/api.md: tokens in the body for `body`, in cookies (and not the body) for `cookie`; `extra`
    fields (a token exchange's `issued_token_type`) beside the others."""
    settings = current_app.config["SETTINGS"]
    access_token = tokens.issue_access_token(user["id"], role, token_version, session_id)
    payload = {
        "token_type": "Bearer",
        "expires_in": settings.access_token_ttl,
        "refresh_expires_in": settings.refresh_token_ttl,
        "session_id": session_id,
        "user": users.public_user(user),
        **(extra or {}),
    }
    if transport == "body":
        payload = {"access_token": access_token, "refresh_token": refresh_token, **payload}
        if device_token is not None:
            payload["device_token"] = device_token
    response = make_response(jsonify(payload), 200)
    response.headers["Cache-Control"] = "no-store"
    if transport == "cookie":
        cookies.set_token_cookies(
            response, access_token, settings.access_token_ttl, refresh_token, settings.refresh_token_ttl
        )
    return response


def device_name(named: str | None) -> str | None:
    """The name the client gives this device, else its User-Agent (control characters as spaces)."""
    if named is not None:
        return named
    agent = request.user_agent.string
    return "".join(" " if has_control_characters(c) else c for c in agent) if agent else None
