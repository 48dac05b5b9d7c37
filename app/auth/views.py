"""The account and session endpoints (docs/api.md, Accounts and sessions): views parse, call, answer."""

from __future__ import annotations

import json
import re

from flask import Blueprint, current_app, jsonify, make_response, request

from .. import audit, mail
from ..errors import ApiError, bad_request, error_response, not_found, unauthorized
from ..http import validated, validated_form
from ..limits import rate_limited
from ..metrics import LOGINS, REFRESHES
from ..openapi import operation
from ..redis import Keys, get_redis
from . import account, cookies, devices, mailtokens, mfa, passwords, sessions, tokens, users
from .answers import device_name as _device_name  # (passkey_views takes it from here)
from .answers import token_response as _token_response
from .guards import api_key_required, authenticate, current_caller, login_required, sets_session_cookies
from .schemas import (
    Introspection,
    IntrospectionAnswer,
    Login,
    Me,
    MfaLogin,
    PasswordChange,
    RefreshTokenBody,
    Registration,
    SessionPath,
    Sessions,
    SessionStatus,
    Tokens,
    UserAnswer,
)

bp = Blueprint("auth", __name__, url_prefix="/auth")

SESSION_ID = re.compile(r"[0-9a-f]{32}")
USER = ("bearer", "cookie")
TOKEN_COOKIES = {"Set-Cookie": "With transport cookie: __Host-access and __Secure-refresh (HttpOnly, Secure, Strict)."}


def _settings():
    return current_app.config["SETTINGS"]


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
@operation("Create an account", tags=["accounts"], body=Registration, responses={201: UserAnswer}, errors=(409, 429))
@sets_session_cookies
@rate_limited("register", per=("address", "email"))
def register():
    """Create an account with a password (201 with U)."""
    registration = validated(Registration)
    user = users.create_user(registration.email, registration.password)
    mail.queue_mail(mail.VERIFY_EMAIL, user_id=user["id"])
    return jsonify({"user": users.public_user(user)}), 201


@bp.post("/login")
@operation(
    "Log in with a password: a session for this device",
    tags=["sessions"],
    body=Login,
    responses={200: Tokens},
    errors=(401, 403, 429),
    headers={200: TOKEN_COOKIES},
)
@sets_session_cookies
@rate_limited("login", per=("address", "email_or_device"))
def login():
    """Check the password and start a session for this device; tokens by cookie or in the body."""
    credentials = validated(Login)
    transport, device = credentials.transport, _device_name(credentials.device)
    user_id = users.find_user_id_by_email(credentials.email)
    user = users.get_user(user_id) if user_id else None
    if not users.password_matches(user, credentials.password):
        LOGINS.labels("failure").inc()
        record_failed_login(user["id"] if user else None, {"method": "password"})
        raise unauthorized("Wrong e-mail or password.", "invalid_credentials")
    account.require_verified_email(user)
    if mfa.is_enabled(user):
        return _mfa_required(user, device)
    LOGINS.labels("success").inc()
    return _logged_in(user, device, transport, credentials.device_token)


def record_failed_login(user_id: str | None, details: dict) -> None:
    """A refused login, recorded by the service (actor `system`), about the account when one was named."""
    audit.record("login.failed", subject=user_id, actor=audit.SYSTEM, details=details)


def _logged_in(user: dict, device: str | None, transport: str, device_token: str | None, login: dict | None = None):
    """Start a session for a user who has proved every factor; `T` in the chosen transport.

    The client becomes a known device of the account (see devices.py): a device cookie, or with the body
    transport a `device_token` in `T` (the one it presented, while that is still good for the account).
    `login` says how they logged in, for the audit entry (by default with a password).
    """
    issued = sessions.start_session(user["id"], device, request.remote_addr, login)
    known = devices.device_token(user, device_token) if transport == "body" else None
    response = _token_response(
        user, issued.session_id, user["role"], int(user["token_version"]), issued.refresh_token, transport, known
    )
    if transport == "cookie":
        devices.remember_device(response, user)
    return response


def _mfa_required(user: dict, device: str | None):
    """401 mfa_required with the mfa_token that POST /auth/login/mfa must present."""
    token = mfa.start_login(user, device)
    response = error_response(401, "mfa_required", "Enter the code from your authenticator app.")
    response.set_data(json.dumps({**response.get_json(), "mfa_token": token}))
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.post("/login/mfa")
@operation(
    "Finish a login with MFA: the mfa_token and a TOTP or recovery code",
    tags=["mfa"],
    body=MfaLogin,
    responses={200: Tokens},
    errors=(400, 401, 403, 429),
    headers={200: TOKEN_COOKIES},
)
@sets_session_cookies
@rate_limited("password", per=("address", "mfa_token", "mfa_account"))
def login_mfa():
    """The second step of a login with MFA: the mfa_token and a TOTP code or a recovery code."""
    second = validated(MfaLogin)
    if second.code is None and second.recovery_code is None:
        raise bad_request("Field 'code' (or 'recovery_code') is required.")
    user_id, first_device, login = mfa.finish_login(second.mfa_token, second.code, second.recovery_code)
    user = users.get_user(user_id)
    if user is None:
        raise mfa.invalid_mfa_token()
    LOGINS.labels("success").inc()
    device = second.device or first_device or _device_name(None)
    return _logged_in(user, device, second.transport, second.device_token, login)


@bp.post("/refresh")
@operation(
    "Rotate a refresh token (from the body or the refresh cookie)",
    tags=["sessions"],
    body=RefreshTokenBody,
    body_required=False,
    responses={200: Tokens},
    errors=(401, 403, 429),
    headers={200: TOKEN_COOKIES},
)
@sets_session_cookies
@rate_limited("refresh", per=("address", "refresh_token"))
def refresh():
    """Rotate a refresh token; a reused one ends its whole family."""
    raw = validated(RefreshTokenBody, optional=True).refresh_token
    transport = "body" if raw is not None else "cookie"
    if raw is None:
        raw = request.cookies.get(cookies.REFRESH_COOKIE)
    if not raw:
        return _refused(unauthorized("No refresh token was presented.", "invalid_refresh_token"), transport)
    if sessions.is_client_refresh_token(raw):
        # A client's session is refreshed by the client at /oauth/token, with the client's own tokens: here it
        # would give the service's access tokens, good at every endpoint, to whoever holds the client's.
        message = "This refresh token is an application's; it refreshes at /oauth/token."
        return _refused(unauthorized(message, "invalid_refresh_token"), transport)
    rotation = sessions.rotate_refresh_token(raw)
    REFRESHES.labels(rotation.outcome).inc()  # `ended` apart from `reused`: a session already over is no theft
    if rotation.outcome == "reused":
        message = "This refresh token was already used; the session has been ended. Log in again."
        return _refused(unauthorized(message, "refresh_token_reused"), transport)
    if rotation.outcome == "ended":
        # The code is the one docs/api.md fixes for a revoked token; the message says what happened.
        message = "This session has ended (logged out, here or on another device); log in again."
        return _refused(unauthorized(message, "refresh_token_reused"), transport)
    user = users.get_user(rotation.user_id) if rotation.outcome != "invalid" else None
    if user is None:
        return _refused(unauthorized("The refresh token is not valid.", "invalid_refresh_token"), transport)
    return _token_response(
        user, rotation.session_id, rotation.role, rotation.token_version, rotation.refresh_token, transport
    )


def _session_to_end() -> tuple[str, str]:
    """(user id, session id) of the caller's session: from the access token, or failing that its refresh token."""
    try:
        caller = authenticate()
        return caller.user_id, caller.session_id
    except ApiError:
        presented = validated(RefreshTokenBody, optional=True).refresh_token
        raw = presented or request.cookies.get(cookies.REFRESH_COOKIE)
        found = sessions.session_of_refresh_token(raw) if raw else None
        if found is None:
            raise
        return found


@bp.post("/logout")
@operation(
    "End this session (by access token, or by refresh token in the body or cookie)",
    tags=["sessions"],
    body=RefreshTokenBody,
    body_required=False,
    responses={204: None},
    errors=(401, 403),
)
def logout():
    """End the current session (its refresh family) and the client sessions authorized from it, and clear the
    cookies."""
    try:
        user_id, session_id = _session_to_end()
    except ApiError as error:
        return _refused(error, "cookie")
    sessions.end_session(user_id, session_id, "logout")
    sessions.end_sessions_authorized_from(user_id, session_id)  # the applications it signed in to (OpenID)
    return _no_content(clear_cookies=True)


@bp.post("/logout-all")
@operation("Log out of every device", tags=["sessions"], responses={204: None}, auth=USER)
@login_required
def logout_all():
    """Log out of every device: tokenVersion + 1, every session ended, live connections closed."""
    sessions.logout_all(current_caller().user_id, "logout")
    return _no_content(clear_cookies=True)


def _active_org_id(caller) -> str | None:
    """The caller's session's active organization now (a removal shows at once, not at the next token)."""
    found = sessions.active_org(caller.user_id, caller.session_id)
    return found[0] if found else None


@bp.get("/me")
@operation("The caller and their session id", tags=["accounts"], responses={200: Me}, auth=USER)
@login_required
def me():
    """The caller and their session id."""
    caller = current_caller()
    return jsonify({"user": caller.user, "session_id": caller.session_id})


@bp.get("/status")
@operation(
    "Whether the caller has a session, and whether a refresh could open one: always 200",
    tags=["accounts"],
    responses={200: SessionStatus},
)
def status():
    """Who is calling, if anyone; answers 200 either way, so that a page's first look logs no error.

    `can_refresh` says only that a refresh cookie came, not that it still works: a client with a revoked
    token must still present it, so that reuse of a stolen one is detected.
    """
    try:
        caller = authenticate()
    except ApiError as refused:
        if refused.status not in (401, 403):  # 403: an API key, which is no user
            raise
        caller = None
    response = jsonify(
        {
            "user": caller.user if caller else None,
            "session_id": caller.session_id if caller else None,
            "org_id": _active_org_id(caller) if caller else None,
            "can_refresh": bool(request.cookies.get(cookies.REFRESH_COOKIE)),
        }
    )
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/sessions")
@operation("The caller's sessions, one per device", tags=["sessions"], responses={200: Sessions}, auth=USER)
@login_required
def list_sessions():
    """The caller's sessions, one per logged-in device."""
    caller = current_caller()
    return jsonify({"sessions": sessions.list_sessions(caller.user_id, caller.session_id)})


@bp.delete("/sessions/<session_id>")
@operation("End one of the caller's sessions", tags=["sessions"], path=SessionPath, responses={204: None}, auth=USER)
@login_required
def end_session(session_id: str):
    """End one of the caller's sessions (another device, or this one)."""
    caller = current_caller()
    if not SESSION_ID.fullmatch(session_id) or not sessions.session_exists(caller.user_id, session_id):
        raise not_found("No such session.")
    ending_itself = session_id == caller.session_id
    sessions.end_session(caller.user_id, session_id, "logout" if ending_itself else "session.revoked")
    if ending_itself:  # a logout, as POST /auth/logout: the applications it signed in to end with it
        sessions.end_sessions_authorized_from(caller.user_id, session_id)
    return _no_content(clear_cookies=ending_itself)


@bp.post("/password")
@operation(
    "Change the password; every other session ends",
    tags=["accounts"],
    body=PasswordChange,
    responses={204: None},
    errors=(429,),
    auth=USER,
)
@rate_limited("password", per=("address", "caller"))
@login_required
def change_password():
    """Change the password after checking the current one; every other session ends."""
    change = validated(PasswordChange)
    current, new = change.current_password, users.validate_password(change.new_password)
    caller = current_caller()
    user = users.get_user(caller.user_id)
    if user is None:
        raise unauthorized()
    if not users.password_matches(user, current):
        raise unauthorized("The current password is wrong.", "invalid_credentials")
    users.change_password_hash(user["id"], passwords.hash_password(new))
    mailtokens.forget_tokens(user["id"], mailtokens.RESET)  # a reset link asked for earlier is moot now
    sessions.end_other_sessions(user["id"], caller.session_id)
    return _no_content()


INACTIVE = {"active": False}


@bp.post("/introspect")
@operation(
    "RFC 7662: is this access token active?",
    tags=["credentials"],
    form=Introspection,
    responses={200: IntrospectionAnswer},
    auth=("api_key",),
)
@api_key_required("tokens:introspect")
def introspect():
    """RFC 7662: whether an access token (the service's, or a client's) is active now, by every rule the service
    applies itself."""
    return jsonify(_introspection(validated_form(Introspection).token))


def _introspection(token: str) -> dict:
    """The active token's claims, or exactly {"active": false} whatever made it inactive. A client's access token
    (the OpenID provider's) answers with its client and scope."""
    try:
        claims = tokens.decode_access_token(token)
    except tokens.TokenExpired:
        return INACTIVE
    except tokens.TokenInvalid:
        return current_app.extensions["client_tokens"].introspection(token) or INACTIVE
    user = sessions.verify_session(claims.user_id, claims.session_id, claims.token_version)
    if user is None:  # logged out, session ended, or an older tokenVersion
        return INACTIVE
    settings = _settings()
    answer = {
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
    if claims.org_id is not None:  # the role held now: a removal or a role change shows at once
        org_role = sessions.member_role(get_redis().hget(Keys.org_members(claims.org_id), claims.user_id))
        if org_role is not None:
            answer.update(org_id=claims.org_id, org_role=org_role)
    return answer
