"""Account lifecycle endpoints (docs/api.md, Account lifecycle): verify an address, reset a forgotten
password, turn TOTP on and off. Views parse, call and answer; the rules live in `mailtokens`, `mfa`
and `app/mail`.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, make_response

from .. import mail
from ..errors import ApiError, bad_request, forbidden, unauthorized
from ..http import json_body, validated
from ..limits import rate_limited
from ..openapi import operation
from ..redis import Keys, get_redis
from . import devices, mailtokens, mfa, passkeys, passwords, sessions, users
from .guards import current_caller, login_required
from .schemas import (
    EmailVerification,
    ForgottenPassword,
    PasswordReset,
    Reauthentication,
    RecoveryCodes,
    ResetTokenCheck,
    TotpConfirmation,
    TotpRemoval,
    TotpSetup,
)

bp = Blueprint("account", __name__, url_prefix="/auth")
USER = ("bearer", "cookie")

VERIFICATION_RESEND_COOLDOWN = 10 * 60  # a refused login re-sends the link at most this often
TOKEN_MAX = 200  # a mailed token is 76 characters (user id, dot, 43); anything much longer is not one of ours


def _empty(status: int):
    response = make_response("", status)
    del response.headers["Content-Type"]
    return response


def invalid_token() -> ApiError:
    """400 invalid_token: a mailed token that is unknown, used, expired or superseded."""
    return ApiError(400, "invalid_token", "This link is not valid (used, expired or replaced by a newer one).")


def _token(token: str) -> str:
    if not token or len(token) > TOKEN_MAX:
        raise invalid_token()
    return token


def require_verified_email(user: dict) -> None:
    """With REQUIRE_VERIFIED_EMAIL, refuse (403) an account whose address is not verified yet.

    The caller has proved the password (or provider login), so a fresh link is sent, at most once per
    cool-down: without a session the account could not ask for one itself.
    """
    if not current_app.config["SETTINGS"].require_verified_email or user.get("email_verified") == "1":
        return
    if get_redis().set(Keys.verification_resent(user["id"]), "1", nx=True, ex=VERIFICATION_RESEND_COOLDOWN):
        mail.queue_mail(mail.VERIFY_EMAIL, user_id=user["id"])
    raise forbidden(
        "Confirm your e-mail address first: open the link we mailed you (a new one is on its way).",
        "email_not_verified",
    )


@bp.post("/email/verify")
@operation(
    "Verify the account's e-mail address with the token from the mail",
    tags=["account"],
    body=EmailVerification,
    responses={204: None},
    errors=(400, 429),
)
@rate_limited("password", per=("address",))
def verify_email():
    """Use the token from a verification mail: the account's address counts as verified."""
    token = _token(validated(EmailVerification).token)
    if mailtokens.verify_email(token) is None:
        raise invalid_token()
    return _empty(204)


@bp.post("/email/verify/resend")
@operation(
    "Mail a new verification link (the older one stops working)",
    tags=["account"],
    responses={202: None},
    errors=(401, 403, 409, 429),
    auth=USER,
)
@rate_limited("mail", per=("address", "caller"))
@login_required
def resend_verification():
    """Mail a new verification link to the caller (the older one stops working)."""
    caller = current_caller()
    if caller.user.get("email_verified"):
        raise ApiError(409, "conflict", "This e-mail address is already verified.")
    if caller.user.get("external"):  # the issuer vouches for (or not) its address; nothing is mailed to it here
        raise ApiError(409, "conflict", "This account's address comes from its issuer and is not verified here.")
    mail.queue_mail(mail.VERIFY_EMAIL, user_id=caller.user_id)
    return _empty(202)


@bp.post("/password/forgot")
@operation(
    "Mail a password-reset link, if an account has this address (the answer is the same either way)",
    tags=["account"],
    body=ForgottenPassword,
    responses={202: None},
    errors=(429,),
)
@rate_limited("mail", per=("address", "email"))
def forgot_password():
    """Queue a reset mail; the answer is the same, and takes the same time, whether or not the account exists.

    The request only records a job for the address as typed; whether an account has it is looked up
    by the mail sender, after the answer.
    """
    mail.queue_mail(mail.PASSWORD_RESET, email=validated(ForgottenPassword).email)
    return _empty(202)


@bp.post("/password/reset/check")
@operation(
    "Whether a reset link's token would still set a password, without using it (the page asks when it opens)",
    tags=["account"],
    body=ResetTokenCheck,
    responses={204: None},
    errors=(400, 429),
)
@rate_limited("password", per=("address",))
def check_reset_token():
    """204 while the token from a reset mail is usable; 400 invalid_token once it is used, expired or replaced."""
    token = _token(validated(ResetTokenCheck).token)
    if mailtokens.token_owner(token, mailtokens.RESET) is None:
        raise invalid_token()
    return _empty(204)


@bp.post("/password/reset")
@operation(
    "Choose a new password with the token from the mail: every session ends",
    tags=["account"],
    body=PasswordReset,
    responses={204: None},
    errors=(400, 429),
)
@rate_limited("password", per=("address",))
def reset_password():
    """Set a new password with a reset token: every session ends and live connections close."""
    asked = validated(PasswordReset)
    token, new_password = _token(asked.token), users.validate_password(asked.new_password)
    if mailtokens.token_owner(token, mailtokens.RESET) is None:
        raise invalid_token()  # before hashing: unknown tokens cost nothing
    reset = mailtokens.reset_password(token, passwords.hash_password(new_password))
    if reset is None:
        raise invalid_token()  # used by a concurrent request meanwhile
    user_id, ended = reset
    sessions.sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=ended, whole_user=True)
    response = _empty(204)
    user = users.get_user(user_id)
    if user:  # whoever reset it controls the mailbox: this browser is the owner's known device from here
        devices.remember_device(response, user)
    return response


def _no_store(response):
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.post("/reauthenticate")
@operation(
    "Prove the password, or a passkey, again: this session counts as recently authenticated for five minutes",
    tags=["account"],
    body=Reauthentication,
    responses={204: None},
    errors=(400, 401, 403, 429),
    auth=USER,
)
@rate_limited("password", per=("address", "caller"))
@login_required
def reauthenticate():
    """Check the password (or one of the caller's passkeys) again and mark the session as recently authenticated.

    A refusal is 401 invalid_credentials and the session goes on.
    """
    challenge = passkeys.take_login_challenge(json_body().get("login_id"))  # every answer uses it up
    proof = validated(Reauthentication)
    caller = current_caller()
    if proof.password is not None:
        if not users.password_matches(users.get_user(caller.user_id), proof.password):
            raise unauthorized("The password is wrong.", "invalid_credentials")
    elif proof.login_id is not None and proof.credential is not None:
        passkeys.authenticate(challenge, proof.credential, user_id=caller.user_id)
    else:
        raise bad_request("Field 'password' (or 'login_id' and 'credential') is required.")
    if not sessions.mark_authenticated(caller.user_id, caller.session_id):
        raise unauthorized("The session has ended; log in again.")
    return _empty(204)


def require_recent_authentication() -> None:
    """403 reauthentication_required unless this session proved a factor in the last five minutes.

    A stolen access token alone must not be enough to take over the account's second factor.
    """
    caller = current_caller()
    if not sessions.recently_authenticated(caller.user_id, caller.session_id):
        raise forbidden(
            "Confirm it is you: enter your password, or use a passkey, again (POST /auth/reauthenticate), then retry.",
            "reauthentication_required",
        )


@bp.post("/mfa/totp/setup")
@operation(
    "Start setting up TOTP: a new secret, its otpauth:// URI and QR code (needs a recent authentication)",
    tags=["mfa"],
    responses={200: TotpSetup},
    errors=(401, 403, 409),
    auth=USER,
)
@login_required
def setup_totp():
    """A new TOTP secret and its otpauth:// URI (and QR code); MFA is on only after confirmation."""
    require_recent_authentication()
    user = users.get_user(current_caller().user_id) or {}
    return _no_store(jsonify(mfa.begin_setup(user)))


@bp.post("/mfa/totp/confirm")
@operation(
    "Confirm TOTP with a current code: MFA is on; the ten recovery codes, shown once",
    tags=["mfa"],
    body=TotpConfirmation,
    responses={200: RecoveryCodes},
    errors=(401, 403, 409, 429),
    auth=USER,
)
@rate_limited("password", per=("address", "caller"))
@login_required
def confirm_totp():
    """Confirm the setup with a current code: MFA is on, and the 10 recovery codes are shown this once."""
    code = validated(TotpConfirmation).code
    user = users.get_user(current_caller().user_id) or {}
    return _no_store(jsonify({"recovery_codes": mfa.confirm_setup(user, code)}))


@bp.delete("/mfa/totp")
@operation(
    "Turn TOTP off: the password and a current code (or a recovery code)",
    tags=["mfa"],
    body=TotpRemoval,
    responses={204: None},
    errors=(400, 401, 403, 409, 429),
    auth=USER,
)
@rate_limited("password", per=("address", "caller"))
@login_required
def disable_totp():
    """Turn MFA off: the password and a current code (or a recovery code) are both required."""
    asked = validated(TotpRemoval)
    if asked.code is None and asked.recovery_code is None:
        raise bad_request("Field 'code' (or 'recovery_code') is required.")
    user = users.get_user(current_caller().user_id) or {}
    if not users.password_matches(user, asked.password):
        raise unauthorized("The password is wrong.", "invalid_credentials")
    mfa.disable(user, asked.code, asked.recovery_code)
    return _no_store(_empty(204))
