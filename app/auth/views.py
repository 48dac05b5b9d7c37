"""The account and session endpoints (docs/api.md, Accounts and sessions): views parse, call, answer."""

from __future__ import annotations

import re

from flask import Blueprint, current_app, jsonify, make_response, request

from ..errors import ApiError, bad_request, error_response, not_found, unauthorized, validation_failed
from ..http import field, has_control_characters, json_body, plain_text
from ..limits import rate_limited
from ..metrics import LOGINS, REFRESHES
from . import cookies, devices, passwords, sessions, tokens, users
from .guards import api_key_required, authenticate, current_caller, login_required, sets_session_cookies

bp = Blueprint("auth", __name__, url_prefix="/auth")
jwks_bp = Blueprint("jwks", __name__)

TRANSPORTS = ("cookie", "body")
SESSION_ID = re.compile(r"[0-9a-f]{32}")


def _settings():
    return current_app.config["SETTINGS"]


def _token_response(user: dict, session_id: str, role: str, token_version: int, refresh_token: str, transport: str):
    """`T` in docs/api.md: tokens in the body for `body`, in cookies (and not the body) for `cookie`."""
    settings = _settings()
    access_token = tokens.issue_access_token(user["id"], role, token_version, session_id)
    payload = {
        "token_type": "Bearer",
        "expires_in": settings.access_token_ttl,
        "refresh_expires_in": settings.refresh_token_ttl,
        "session_id": session_id,
        "user": users.public_user(user),
    }
    if transport == "body":
        payload = {"access_token": access_token, "refresh_token": refresh_token, **payload}
    response = make_response(jsonify(payload), 200)
    response.headers["Cache-Control"] = "no-store"
    if transport == "cookie":
        cookies.set_token_cookies(
            response, access_token, settings.access_token_ttl, refresh_token, settings.refresh_token_ttl
        )
    return response


def _no_content(clear_cookies: bool = False):
    response = make_response("", 204)
    del response.headers["Content-Type"]  # a 204 has no body, so no type
    if clear_cookies:
        cookies.clear_token_cookies(response)
    return response


def _refused(error: ApiError, transport: str):
    """A 401 that also drops the browser's now useless cookies."""
    response = error_response(error.status, error.code, error.message)
    if transport == "cookie":
        cookies.clear_token_cookies(response)
    return response


@bp.post("/register")
@sets_session_cookies
@rate_limited("register", per=("address", "email"))
def register():
    """Create an account with a password (201 with U)."""
    body = json_body()
    email, password = field(body, "email"), field(body, "password")
    user = users.create_user(email, password)
    return jsonify({"user": users.public_user(user)}), 201


def _device_name(body: dict) -> str | None:
    """The name the client gives this device (422 with control characters), else its User-Agent."""
    named = field(body, "device", required=False)
    if named is not None:
        return plain_text(named, "The device name")
    agent = request.user_agent.string
    return "".join(" " if has_control_characters(c) else c for c in agent) if agent else None


@bp.post("/login")
@sets_session_cookies
@rate_limited("login", per=("address", "email_or_device"))
def login():
    """Check the password and start a session for this device; tokens by cookie or in the body."""
    body = json_body()
    email, password = field(body, "email"), field(body, "password")
    transport = field(body, "transport", required=False, default="cookie")
    device = _device_name(body)
    if transport not in TRANSPORTS:
        raise validation_failed("transport must be 'cookie' or 'body'.")
    user_id = users.find_user_id_by_email(email)
    user = users.get_user(user_id) if user_id else None
    if not users.password_matches(user, password):
        LOGINS.labels("failure").inc()
        raise unauthorized("Wrong e-mail or password.", "invalid_credentials")
    LOGINS.labels("success").inc()
    issued = sessions.start_session(user["id"], device, request.remote_addr)
    response = _token_response(
        user, issued.session_id, user["role"], int(user["token_version"]), issued.refresh_token, transport
    )
    if transport == "cookie":
        devices.remember_device(response, user["id"])
    return response


@bp.post("/refresh")
@sets_session_cookies
@rate_limited("refresh", per=("address", "refresh_token"))
def refresh():
    """Rotate a refresh token; a reused one ends its whole family."""
    body = json_body(optional=True)
    raw = field(body, "refresh_token", required=False)
    transport = "body" if raw is not None else "cookie"
    if raw is None:
        raw = request.cookies.get(cookies.REFRESH_COOKIE)
    if not raw:
        return _refused(unauthorized("No refresh token was presented.", "invalid_refresh_token"), transport)
    rotation = sessions.rotate_refresh_token(raw)
    REFRESHES.labels(rotation.outcome).inc()
    if rotation.outcome == "reused":
        message = "This refresh token was already used; the session has been ended. Log in again."
        return _refused(unauthorized(message, "refresh_token_reused"), transport)
    user = users.get_user(rotation.user_id) if rotation.outcome != "invalid" else None
    if user is None:
        return _refused(unauthorized("The refresh token is not valid.", "invalid_refresh_token"), transport)
    return _token_response(
        user, rotation.session_id, rotation.role, rotation.token_version, rotation.refresh_token, transport
    )


def _session_to_end() -> str:
    """The caller's session: from the access token, or failing that from its refresh token."""
    try:
        return authenticate().session_id
    except ApiError:
        body = json_body(optional=True)
        raw = field(body, "refresh_token", required=False) or request.cookies.get(cookies.REFRESH_COOKIE)
        found = sessions.session_of_refresh_token(raw) if raw else None
        if found is None:
            raise
        return found[1]


@bp.post("/logout")
def logout():
    """End the current session (its refresh family) and clear the cookies."""
    try:
        session_id = _session_to_end()
    except ApiError as error:
        return _refused(error, "cookie")
    sessions.end_session(session_id)
    return _no_content(clear_cookies=True)


@bp.post("/logout-all")
@login_required
def logout_all():
    """Log out of every device: tokenVersion + 1, every session ended, live connections closed."""
    sessions.logout_all(current_caller().user_id)
    return _no_content(clear_cookies=True)


@bp.get("/me")
@login_required
def me():
    """The caller and their session id."""
    caller = current_caller()
    return jsonify({"user": caller.user, "session_id": caller.session_id})


@bp.get("/sessions")
@login_required
def list_sessions():
    """The caller's sessions, one per logged-in device."""
    caller = current_caller()
    return jsonify({"sessions": sessions.list_sessions(caller.user_id, caller.session_id)})


@bp.delete("/sessions/<session_id>")
@login_required
def end_session(session_id: str):
    """End one of the caller's sessions (another device, or this one)."""
    caller = current_caller()
    if not SESSION_ID.fullmatch(session_id) or sessions.session_owner(session_id) != caller.user_id:
        raise not_found("No such session.")
    sessions.end_session(session_id)
    return _no_content(clear_cookies=session_id == caller.session_id)


@bp.post("/password")
@rate_limited("password", per=("address", "caller"))
@login_required
def change_password():
    """Change the password after checking the current one; every other session ends."""
    body = json_body()
    current, new = field(body, "current_password"), field(body, "new_password")
    users.validate_password(new)
    caller = current_caller()
    user = users.get_user(caller.user_id)
    if user is None:
        raise unauthorized()
    if not users.password_matches(user, current):
        raise unauthorized("The current password is wrong.", "invalid_credentials")
    users.store_password_hash(user["id"], passwords.hash_password(new))
    sessions.end_other_sessions(user["id"], caller.session_id)
    return _no_content()


INACTIVE = {"active": False}


@bp.post("/introspect")
@api_key_required("tokens:introspect")
def introspect():
    """RFC 7662: whether an access token is active now, by every rule the service applies itself."""
    if request.mimetype != "application/x-www-form-urlencoded":
        raise ApiError(415, "unsupported_media_type", "Send the token as a form: token=<access token>.")
    token = request.form.get("token")
    if not token:
        raise bad_request("The form field 'token' is required.")
    return jsonify(_introspection(token))


def _introspection(token: str) -> dict:
    """The active token's claims, or exactly {"active": false} whatever made it inactive."""
    try:
        claims = tokens.decode_access_token(token)
    except (tokens.TokenExpired, tokens.TokenInvalid):
        return INACTIVE
    user = sessions.verify_session(claims.user_id, claims.session_id, claims.token_version)
    if user is None:  # logged out, session ended, or an older tokenVersion
        return INACTIVE
    settings = _settings()
    return {
        "active": True,
        "sub": claims.user_id,
        "role": user["role"],  # the stored role, as the service's own checks use it
        "sid": claims.session_id,
        "ver": claims.token_version,
        "exp": claims.expires_at,
        "iat": claims.issued_at,
        "iss": settings.jwt_issuer,
        "aud": settings.jwt_audience,
        "token_type": "access_token",
    }


@jwks_bp.get("/.well-known/jwks.json")
def jwks():
    """The public key that verifies access tokens (asymmetric algorithms only)."""
    keys = current_app.extensions["token_keys"]
    if not keys.kid:
        raise not_found("This service signs with a shared secret; there is no public key.")
    response = jsonify(keys.jwks)
    response.headers["Cache-Control"] = "public, max-age=300"
    return response
