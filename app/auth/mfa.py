"""TOTP second factor (RFC 6238, pyotp): setup, confirmation with recovery codes, two-step login.

A code is accepted once: the time step of the last accepted code is kept, and a code is taken only
for a later step (one step of clock skew either way is allowed). Recovery codes are random, shown
once, stored under a keyed hash (HMAC-SHA256 with a key derived from SECRET_KEY, so a copy of the
database alone cannot test guesses) and removed when used. The half-finished login between the
password and the code is an `mfa_token` (256 bits, stored hashed, five minutes, five wrong codes, used
once). Every check that accepts a code is one Lua step, so two requests with the same code cannot both
pass. Wrong codes in a row are also counted per account: past MFA_MAX_FAILURES the account's MFA login
is locked until its password is reset (or an administrator resets its MFA).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

import pyotp
import segno
from flask import current_app

from .. import audit, mail
from ..errors import ApiError, unauthorized
from ..mail.messages import MFA_ENABLED, MFA_LOCKED, MFA_RESET
from ..redis import AUDIT_LUA, END_SESSION_FUNCTION_LUA, Keys, get_redis, get_script
from .sessions import run_listed, sessions_ended

RECOVERY_CODE_COUNT = 10
MFA_TOKEN_SECONDS = 5 * 60
MAX_FAILURES = 5
VALID_WINDOW = 1  # one 30 s step of clock skew either way
CODE = re.compile(r"\d{6}")
USER_ID = re.compile(r"[0-9a-f]{32}")
RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i to misread


def invalid_code() -> ApiError:
    """401 invalid_mfa_code: wrong, reused or malformed."""
    return unauthorized("The code is not valid.", "invalid_mfa_code")


def mfa_locked() -> ApiError:
    """429 mfa_locked: too many wrong codes in a row; no waiting helps (so no Retry-After)."""
    return ApiError(
        429,
        "mfa_locked",
        "Too many wrong codes: two-factor login is locked for this account. Reset your password to unlock it.",
    )


def code_already_used() -> ApiError:
    """401 invalid_mfa_code for a right code whose time step was used already."""
    return unauthorized("This code was used already; wait for the next one from your app.", "invalid_mfa_code")


def invalid_mfa_token() -> ApiError:
    """400 invalid_token: the half-finished login is unknown, used, expired or out of guesses."""
    return ApiError(400, "invalid_token", "This login attempt has expired; log in again.")


def is_enabled(user: dict) -> bool:
    """Whether the account has a confirmed TOTP secret."""
    return bool(user.get("totp_secret"))


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _normalise_recovery_code(code: str) -> str:
    return re.sub(r"[\s-]", "", code).lower()


def _recovery_hash(code: str) -> str:
    """The keyed hash a recovery code is stored under."""
    key = hashlib.sha256(b"recovery-code:" + current_app.config["SECRET_KEY"].encode()).digest()
    return hmac.new(key, _normalise_recovery_code(code).encode(), hashlib.sha256).hexdigest()


def _timecode(secret: str, code: str) -> int:
    """The time step the code belongs to, or -1 when it matches none within the window."""
    code = re.sub(r"\s", "", code)
    if not secret or not CODE.fullmatch(code):
        return -1
    try:
        return pyotp.TOTP(secret).verify_and_get_timecode(code, valid_window=VALID_WINDOW)
    except pyotp.exceptions.OTPVerificationError:
        return -1


def qr_svg(uri: str) -> str:
    """The URI as an inline SVG QR code, made here so the page needs no third-party script."""
    return segno.make(uri, error="m", micro=False).svg_inline(scale=4, border=4, title="QR code for your app")


def begin_setup(user: dict) -> dict:
    """A new secret, pending until confirmed with a code from it; 409 while MFA is on."""
    if is_enabled(user):
        raise ApiError(409, "conflict", "Two-factor authentication is already on; turn it off first.")
    secret = pyotp.random_base32()  # 160 bits, as RFC 4226 recommends
    get_redis().hset(Keys.user(user["id"]), "totp_pending", secret)
    issuer = current_app.config["SETTINGS"].jwt_issuer
    uri = pyotp.TOTP(secret).provisioning_uri(name=user["email"], issuer_name=issuer)
    return {"secret": secret, "otpauth_uri": uri, "qr_svg": qr_svg(uri)}


# KEYS[1] user, KEYS[2] recovery codes, then the mfa.enabled audit entry's (AUDIT_LUA). ARGV: pending
# secret, time step, then the codes' hashes, then the entry's (three).
CONFIRM_LUA = (
    AUDIT_LUA
    + """
if redis.call('HGET', KEYS[1], 'totp_pending') ~= ARGV[1] then return 0 end
local last = tonumber(redis.call('HGET', KEYS[1], 'totp_last_timecode') or '-1')
if tonumber(ARGV[2]) < 0 or tonumber(ARGV[2]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'totp_secret', ARGV[1], 'totp_last_timecode', ARGV[2])
redis.call('HDEL', KEYS[1], 'totp_pending')
redis.call('DEL', KEYS[2])
redis.call('SADD', KEYS[2], unpack(ARGV, 3, #ARGV - 3))
record_audit()
return 1
"""
)


def confirm_setup(user: dict, code: str) -> list[str]:
    """Turn MFA on with a code from the pending secret; the recovery codes (shown this once)."""
    pending = user.get("totp_pending")
    if is_enabled(user):
        raise ApiError(409, "conflict", "Two-factor authentication is already on.")
    if not pending:
        raise ApiError(409, "conflict", "Start the setup first (POST /auth/mfa/totp/setup).")
    codes = [_new_recovery_code() for _ in range(RECOVERY_CODE_COUNT)]
    entry = audit.new_entry("mfa.enabled", subject=user["id"], details={"method": "totp"})
    confirmed = get_script(CONFIRM_LUA)(
        keys=[Keys.user(user["id"]), Keys.user_recovery_codes(user["id"]), *audit.script_keys(entry)],
        args=[pending, _timecode(pending, code), *(_recovery_hash(c) for c in codes), *audit.script_args(entry)],
    )
    if not confirmed:
        raise invalid_code()
    audit.complete(entry)
    mail.queue_mail(MFA_ENABLED, user_id=user["id"])  # so an owner whose token was stolen learns of it
    return codes


def _new_recovery_code() -> str:
    raw = "".join(secrets.choice(RECOVERY_ALPHABET) for _ in range(10))  # about 50 bits
    return f"{raw[:5]}-{raw[5:]}"


# The fields of a user's record that make up its second factor: what turning MFA off removes (DISABLE_LUA,
# RESET_LUA, and an OAuth takeover in auth/oauth.py).
MFA_FIELDS_LUA = "'totp_secret', 'totp_pending', 'totp_last_timecode', 'mfa_failures'"

# Shared by the scripts that accept a second factor, given the user's record and recovery codes.
# method 'totp': `value` the secret checked against, `extra` the code's time step; 'recovery': `value`
# the code's keyed hash, `extra` its plain SHA-256 (how codes made before keyed hashes were stored).
# 'ok' when accepted, 'used' for a right TOTP code whose time step was used already, else false.
_ACCEPT_LUA = """
local function accept(user_key, recovery_key, method, value, extra)
  if method == 'totp' then
    local last = tonumber(redis.call('HGET', user_key, 'totp_last_timecode') or '-1')
    local t = tonumber(extra)
    if t < 0 or redis.call('HGET', user_key, 'totp_secret') ~= value then return false end
    if t <= last then return 'used' end
    redis.call('HSET', user_key, 'totp_last_timecode', extra)
    return 'ok'
  end
  if redis.call('SREM', recovery_key, value) == 1 or redis.call('SREM', recovery_key, extra) == 1 then
    return 'ok'
  end
  return false
end
"""

# KEYS[1] the mfa_token's record, KEYS[2] user, KEYS[3] recovery codes.
# ARGV: method, value, extra, wrong codes allowed per mfa_token, wrong codes in a row allowed per account.
# ok | invalid_token | invalid_code | used | locked | locked_now (this wrong code reached the account's limit)
FINISH_LOGIN_LUA = (
    _ACCEPT_LUA
    + """
local rec = redis.call('HMGET', KEYS[1], 'user_id', 'token_version')
if not rec[1] then return 'invalid_token' end
local user = redis.call('HMGET', KEYS[2], 'token_version', 'totp_secret', 'mfa_failures')
if user[1] ~= rec[2] or not user[2] then
  redis.call('DEL', KEYS[1])
  return 'invalid_token'
end
if tonumber(user[3] or '0') >= tonumber(ARGV[5]) then return 'locked' end
local accepted = accept(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
if accepted == 'ok' then
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[2], 'mfa_failures')
  return 'ok'
end
if redis.call('HINCRBY', KEYS[1], 'failures', 1) >= tonumber(ARGV[4]) then redis.call('DEL', KEYS[1]) end
if redis.call('HINCRBY', KEYS[2], 'mfa_failures', 1) == tonumber(ARGV[5]) then return 'locked_now' end
return accepted or 'invalid_code'
"""
)

# KEYS[1] user, KEYS[2] recovery codes, then the mfa.disabled audit entry's (AUDIT_LUA). ARGV: method,
# value, extra, then the entry's. Accepts the factor and turns MFA off, recorded, in the same step:
# 'ok', 'used' or false.
DISABLE_LUA = (
    _ACCEPT_LUA
    + AUDIT_LUA
    + """
local accepted = accept(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
if accepted ~= 'ok' then return accepted end
redis.call('HDEL', KEYS[1], """
    + MFA_FIELDS_LUA
    + """)
redis.call('DEL', KEYS[2])
record_audit()
return 'ok'
"""
)

# KEYS: 1 user, 2 recovery codes, 3 the user's session set, then the listing of every session
# (SESSIONS_LUA), then the mfa.reset audit entry's (AUDIT_LUA). ARGV: now, then the listing, then the
# entry's. An administrator's reset: the TOTP secret, the recovery codes and the lock go, tokenVersion + 1
# and every session ends, recorded, in one step. {ended ids}, nil or 'stale'.
RESET_LUA = (
    END_SESSION_FUNCTION_LUA
    + AUDIT_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local sessions = listed_sessions(4, 2)
if not still_current(sessions, KEYS[3], nil, false) then return 'stale' end
redis.call('HDEL', KEYS[1], """
    + MFA_FIELDS_LUA
    + """)
redis.call('DEL', KEYS[2])
redis.call('HINCRBY', KEYS[1], 'token_version', 1)
record_audit()
return {1, end_sessions(sessions, KEYS[3], ARGV[1], false)}
"""
)


def _factor(user: dict, code: str | None, recovery_code: str | None) -> list:
    """The Lua arguments for the factor presented: a TOTP code, or else a recovery code."""
    if code is not None:
        secret = user.get("totp_secret", "")
        return ["totp", secret, _timecode(secret, code)]
    return ["recovery", _recovery_hash(recovery_code or ""), _hash(_normalise_recovery_code(recovery_code or ""))]


def start_login(user: dict, device: str | None, method: str = "password") -> str:
    """After the right password (or provider login, `method` "oauth"): the mfa_token that the second step
    must present.

    `<user id>.<256 random bits>`: the id says where the pending login is kept (beside the user's
    record, so accepting a code is one step on a Redis Cluster too).
    """
    raw = f"{user['id']}.{secrets.token_urlsafe(32)}"
    key = Keys.mfa_login(user["id"], _hash(raw))
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(
        key,
        mapping={
            "user_id": user["id"],
            "token_version": user["token_version"],
            "device": device or "",
            "method": method,
            "failures": 0,
        },
    )
    pipe.expire(key, MFA_TOKEN_SECONDS)
    pipe.execute()
    return raw


def _user_of(mfa_token: str) -> str | None:
    user_id, dot, rest = mfa_token.partition(".")
    return user_id if dot and rest and USER_ID.fullmatch(user_id) else None


def login_user_id(mfa_token: str) -> str | None:
    """The user a pending mfa_token belongs to (for per-account rate limits), if it is still pending."""
    user_id = _user_of(mfa_token)
    return get_redis().hget(Keys.mfa_login(user_id, _hash(mfa_token)), "user_id") if user_id else None


def finish_login(mfa_token: str, code: str | None, recovery_code: str | None) -> tuple[str, str | None, dict]:
    """Check the second factor against a pending login; (user id, device name, how they logged in) when it
    is accepted.

    400 invalid_token for an unknown, used, expired or exhausted mfa_token (and when the account's
    sessions were ended meanwhile); 401 invalid_mfa_code for a wrong, reused or malformed code (a failed
    login, recorded); 429 mfa_locked once the account has had too many wrong codes in a row (its owner is
    mailed then).
    """
    user_id = _user_of(mfa_token)
    if user_id is None:
        raise invalid_mfa_token()
    key = Keys.mfa_login(user_id, _hash(mfa_token))
    record = get_redis().hgetall(key)
    if not record:
        raise invalid_mfa_token()
    user = get_redis().hgetall(Keys.user(record["user_id"]))
    outcome = get_script(FINISH_LOGIN_LUA)(
        keys=[key, Keys.user(record["user_id"]), Keys.user_recovery_codes(record["user_id"])],
        args=[*_factor(user, code, recovery_code), MAX_FAILURES, current_app.config["SETTINGS"].mfa_max_failures],
    )
    second_factor = "totp" if code is not None else "recovery_code"
    login = {"method": record.get("method") or "password", "second_factor": second_factor}
    if outcome == "invalid_token":
        raise invalid_mfa_token()
    if outcome == "locked":
        raise mfa_locked()
    if outcome != "ok":  # a wrong or reused code: counted against the account, and recorded
        audit.record("login.failed", subject=record["user_id"], actor=audit.SYSTEM, details=login)
    if outcome == "locked_now":
        mail.queue_mail(MFA_LOCKED, user_id=record["user_id"])
    if outcome == "used":
        raise code_already_used()
    if outcome != "ok":
        raise invalid_code()
    return record["user_id"], record.get("device") or None, login


def disable(user: dict, code: str | None, recovery_code: str | None) -> None:
    """Turn MFA off after a TOTP or recovery code (the caller has checked the password)."""
    if not is_enabled(user):
        raise ApiError(409, "conflict", "Two-factor authentication is not on.")
    factor = "totp" if code is not None else "recovery_code"
    entry = audit.new_entry("mfa.disabled", subject=user["id"], details={"method": "totp", "factor": factor})
    outcome = get_script(DISABLE_LUA)(
        keys=[Keys.user(user["id"]), Keys.user_recovery_codes(user["id"]), *audit.script_keys(entry)],
        args=[*_factor(user, code, recovery_code), *audit.script_args(entry)],
    )
    if outcome == "used":
        raise code_already_used()
    if outcome != "ok":
        raise invalid_code()
    audit.complete(entry)


def reset(user_id: str) -> list[str] | None:
    """An administrator's reset: MFA off, recovery codes gone, every session ended, the owner mailed.

    Returns the ended session ids, or None for an unknown user. The owner can set MFA up again
    after logging in.
    """
    client = get_redis()
    was_enabled = client.hexists(Keys.user(user_id), "totp_secret")
    entry = audit.new_entry("mfa.reset", subject=user_id, details={"was_enabled": bool(was_enabled)})
    script = get_script(RESET_LUA)
    result = run_listed(
        lambda listing, args: script(
            keys=[
                Keys.user(user_id),
                Keys.user_recovery_codes(user_id),
                Keys.user_sessions(user_id),
                *listing,
                *audit.script_keys(entry),
            ],
            args=[f"{time.time():.3f}", *args, *audit.script_args(entry)],
        ),
        user_id,
        lambda: sorted(client.smembers(Keys.user_sessions(user_id))),
    )
    if not result:
        return None
    audit.complete(entry)
    ended = list(result[1])
    sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=ended, whole_user=True)
    mail.queue_mail(MFA_RESET, user_id=user_id)
    return ended
