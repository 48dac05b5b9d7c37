"""TOTP second factor (RFC 6238, pyotp): setup, confirmation with recovery codes, two-step login.

A code is accepted once: the time step of the last accepted code is kept, and a code is taken only
for a later step (one step of clock skew either way is allowed). Recovery codes are random, shown
once, stored as SHA-256 and removed when used. The half-finished login between the password and the
code is an `mfa_token` (256 bits, stored hashed, five minutes, five wrong codes, used once). Every
check that accepts a code is one Lua step, so two requests with the same code cannot both pass.
"""

from __future__ import annotations

import hashlib
import re
import secrets

import pyotp
import segno
from flask import current_app

from ..errors import ApiError, unauthorized
from ..redis import Keys, get_redis, get_script

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


# KEYS[1] user, KEYS[2] recovery codes. ARGV: pending secret, time step, then the codes' hashes.
CONFIRM_LUA = """
if redis.call('HGET', KEYS[1], 'totp_pending') ~= ARGV[1] then return 0 end
local last = tonumber(redis.call('HGET', KEYS[1], 'totp_last_timecode') or '-1')
if tonumber(ARGV[2]) < 0 or tonumber(ARGV[2]) <= last then return 0 end
redis.call('HSET', KEYS[1], 'totp_secret', ARGV[1], 'totp_last_timecode', ARGV[2])
redis.call('HDEL', KEYS[1], 'totp_pending')
redis.call('DEL', KEYS[2])
redis.call('SADD', KEYS[2], unpack(ARGV, 3))
return 1
"""


def confirm_setup(user: dict, code: str) -> list[str]:
    """Turn MFA on with a code from the pending secret; the recovery codes (shown this once)."""
    pending = user.get("totp_pending")
    if is_enabled(user):
        raise ApiError(409, "conflict", "Two-factor authentication is already on.")
    if not pending:
        raise ApiError(409, "conflict", "Start the setup first (POST /auth/mfa/totp/setup).")
    codes = [_new_recovery_code() for _ in range(RECOVERY_CODE_COUNT)]
    confirmed = get_script(CONFIRM_LUA)(
        keys=[Keys.user(user["id"]), Keys.user_recovery_codes(user["id"])],
        args=[pending, _timecode(pending, code), *(_hash(_normalise_recovery_code(c)) for c in codes)],
    )
    if not confirmed:
        raise invalid_code()
    return codes


def _new_recovery_code() -> str:
    raw = "".join(secrets.choice(RECOVERY_ALPHABET) for _ in range(10))  # about 50 bits
    return f"{raw[:5]}-{raw[5:]}"


# Shared by the scripts that accept a second factor, given the user's record and recovery codes.
# method 'totp': the secret checked against and the code's time step; 'recovery': the code's hash.
_ACCEPT_LUA = """
local function accept(user_key, recovery_key, method, value, step)
  if method == 'totp' then
    local last = tonumber(redis.call('HGET', user_key, 'totp_last_timecode') or '-1')
    local t = tonumber(step)
    if t < 0 or redis.call('HGET', user_key, 'totp_secret') ~= value or t <= last then return false end
    redis.call('HSET', user_key, 'totp_last_timecode', step)
    return true
  end
  return redis.call('SREM', recovery_key, value) == 1
end
"""

# KEYS[1] the mfa_token's record, KEYS[2] user, KEYS[3] recovery codes.
# ARGV: method, value, time step, failures allowed. ok | invalid_token | invalid_code
FINISH_LOGIN_LUA = (
    _ACCEPT_LUA
    + """
local rec = redis.call('HMGET', KEYS[1], 'user_id', 'token_version')
if not rec[1] then return 'invalid_token' end
local user = redis.call('HMGET', KEYS[2], 'token_version', 'totp_secret')
if user[1] ~= rec[2] or not user[2] then
  redis.call('DEL', KEYS[1])
  return 'invalid_token'
end
if accept(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3]) then
  redis.call('DEL', KEYS[1])
  return 'ok'
end
if redis.call('HINCRBY', KEYS[1], 'failures', 1) >= tonumber(ARGV[4]) then redis.call('DEL', KEYS[1]) end
return 'invalid_code'
"""
)

# KEYS[1] user, KEYS[2] recovery codes. ARGV: method, value, time step.
# Accepts the factor and turns MFA off in the same step.
DISABLE_LUA = (
    _ACCEPT_LUA
    + """
if not accept(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
redis.call('HDEL', KEYS[1], 'totp_secret', 'totp_pending', 'totp_last_timecode')
redis.call('DEL', KEYS[2])
return 1
"""
)


def _factor(user: dict, code: str | None, recovery_code: str | None) -> list:
    """The Lua arguments for the factor presented: a TOTP code, or else a recovery code."""
    if code is not None:
        secret = user.get("totp_secret", "")
        return ["totp", secret, _timecode(secret, code)]
    return ["recovery", _hash(_normalise_recovery_code(recovery_code or "")), -1]


def start_login(user: dict, device: str | None) -> str:
    """After the right password: the mfa_token that the second step must present.

    `<user id>.<256 random bits>`: the id says where the pending login is kept (beside the user's
    record, so accepting a code is one step on a Redis Cluster too).
    """
    raw = f"{user['id']}.{secrets.token_urlsafe(32)}"
    key = Keys.mfa_login(user["id"], _hash(raw))
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(
        key,
        mapping={"user_id": user["id"], "token_version": user["token_version"], "device": device or "", "failures": 0},
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


def finish_login(mfa_token: str, code: str | None, recovery_code: str | None) -> tuple[str, str | None]:
    """Check the second factor against a pending login; (user id, device name) when it is accepted.

    400 invalid_token for an unknown, used, expired or exhausted mfa_token (and when the account's
    sessions were ended meanwhile); 401 invalid_mfa_code for a wrong, reused or malformed code.
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
        args=[*_factor(user, code, recovery_code), MAX_FAILURES],
    )
    if outcome == "invalid_token":
        raise invalid_mfa_token()
    if outcome != "ok":
        raise invalid_code()
    return record["user_id"], record.get("device") or None


def disable(user: dict, code: str | None, recovery_code: str | None) -> None:
    """Turn MFA off after a TOTP or recovery code (the caller has checked the password)."""
    if not is_enabled(user):
        raise ApiError(409, "conflict", "Two-factor authentication is not on.")
    done = get_script(DISABLE_LUA)(
        keys=[Keys.user(user["id"]), Keys.user_recovery_codes(user["id"])],
        args=_factor(user, code, recovery_code),
    )
    if not done:
        raise invalid_code()
