"""The passkey endpoints (docs/api.md, Passkeys): views parse, call `passkeys`, answer.

Registering needs a recent authentication, as setting up TOTP does: a stolen access token alone must
not add a way into the account. A passkey login is a complete login (no TOTP asked), under the same
rate limits, REQUIRE_VERIFIED_EMAIL and session rules as a password login, and answers `T` the same way.
"""

from __future__ import annotations

import contextlib

from flask import Blueprint, jsonify

from ..errors import ApiError, not_found
from ..http import json_body, validated
from ..limits import rate_limited
from ..metrics import LOGINS
from ..openapi import operation
from . import account, passkeys
from .guards import current_caller, login_required, sets_session_cookies
from .schemas import (
    Passkey,
    PasskeyCreationOptions,
    PasskeyLogin,
    PasskeyLoginStart,
    PasskeyPath,
    PasskeyRegistration,
    PasskeyRename,
    PasskeyRequestOptions,
    Passkeys,
    Tokens,
)
from .views import TOKEN_COOKIES, _device_name, _logged_in, _no_content, record_failed_login

bp = Blueprint("passkeys", __name__, url_prefix="/auth/passkeys")
USER = ("bearer", "cookie")


@bp.post("/register/options")
@operation(
    "Options for registering a new passkey (needs a recent authentication)",
    tags=["passkeys"],
    responses={200: PasskeyCreationOptions},
    errors=(400,),
    auth=USER,
)
@login_required
def registration_options():
    """PublicKeyCredentialCreationOptionsJSON for navigator.credentials.create(); 403 without a recent login."""
    account.require_recent_authentication()
    caller = current_caller()
    return jsonify({"options": passkeys.registration_options(caller.user, caller.session_id)})


@bp.post("")
@operation(
    "Register a passkey: the credential answering the last registration options",
    tags=["passkeys"],
    body=PasskeyRegistration,
    responses={201: Passkey},
    errors=(409,),
    auth=USER,
)
@login_required
def register():
    """Verify the new credential against the caller's last options (used up either way) and keep it."""
    caller = current_caller()
    challenge = passkeys.take_registration_challenge(caller.user_id, caller.session_id)  # used up, refused or not
    asked = validated(PasskeyRegistration)
    return jsonify(passkeys.register(caller, challenge, asked.credential, asked.name)), 201


@bp.get("")
@operation("The caller's passkeys", tags=["passkeys"], responses={200: Passkeys}, auth=USER)
@login_required
def list_passkeys():
    """The caller's passkeys, oldest first."""
    return jsonify({"passkeys": passkeys.list_passkeys(current_caller().user_id)})


@bp.patch("/<passkey_id>")
@operation(
    "Rename one of the caller's passkeys",
    tags=["passkeys"],
    path=PasskeyPath,
    body=PasskeyRename,
    responses={200: Passkey},
    auth=USER,
)
@login_required
def rename(passkey_id: str):
    """Give one of the caller's passkeys a new name; 404 for any other id."""
    renamed = passkeys.rename(current_caller().user_id, passkey_id, validated(PasskeyRename).name)
    if renamed is None:
        raise not_found("No such passkey.")
    return jsonify(renamed)


@bp.delete("/<passkey_id>")
@operation("Remove one of the caller's passkeys", tags=["passkeys"], path=PasskeyPath, responses={204: None}, auth=USER)
@login_required
def remove(passkey_id: str):
    """Delete one of the caller's passkeys: it no longer logs in; 404 for any other id."""
    if not passkeys.remove(current_caller().user_id, passkey_id):
        raise not_found("No such passkey.")
    return _no_content()


@bp.post("/login/options")
@operation(
    "Options for logging in with a passkey, and the login_id to answer them with",
    tags=["passkeys"],
    body=PasskeyLoginStart,
    body_required=False,
    responses={200: PasskeyRequestOptions},
    errors=(429,),
)
@rate_limited("passkey_options", per=("address",))
def login_options():
    """PublicKeyCredentialRequestOptionsJSON with an empty allowCredentials, the same for every address; with
    an e-mail, a login for that account alone."""
    return jsonify(passkeys.login_options(validated(PasskeyLoginStart, optional=True).email))


@bp.post("/login")
@operation(
    "Log in with a passkey: a session for this device, as a password login starts one",
    tags=["passkeys"],
    body=PasskeyLogin,
    responses={200: Tokens},
    errors=(401, 403, 429),
    headers={200: TOKEN_COOKIES},
)
@sets_session_cookies
@rate_limited("login", per=("address", "passkey_account"))
def login():
    """Verify the passkey's answer to the options of `login_id` and start a session; no TOTP is asked."""
    challenge = passkeys.take_login_challenge(json_body().get("login_id"))  # every answer uses it up
    asked = validated(PasskeyLogin)
    with _counting_refusals(asked.credential):
        assertion = passkeys.verify_login(challenge, asked.credential)
    account.require_verified_email(assertion.user)
    with _counting_refusals(asked.credential):
        passkeys.use(assertion)
    LOGINS.labels("success").inc()
    device = _device_name(asked.device)
    return _logged_in(assertion.user, device, asked.transport, asked.device_token, {"method": "passkey"})


@contextlib.contextmanager
def _counting_refusals(credential: dict):
    """A refused passkey (401) counts as a failed login, as a wrong password does, and is recorded as one
    about the account whose passkey it names (if it names one)."""
    try:
        yield
    except ApiError as refusal:
        if refusal.status == 401:
            LOGINS.labels("failure").inc()
            record_failed_login(passkeys.find_owner(credential.get("id")), {"method": "passkey"})
        raise
