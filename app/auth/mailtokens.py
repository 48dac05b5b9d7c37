"""Tokens sent by mail (e-mail verification, password reset): random, single-use, stored hashed.

Each token is `<user id>.<256 random bits>`; Redis keeps only its SHA-256, with the address it was sent
to and its expiry, in one hash per user and purpose (under the user's hash tag, so consuming a token
and changing the account are one step on a Redis Cluster too). Per user and purpose only the newest
token is valid: issuing one replaces the one before. Consuming is an atomic step (the refresh-token
pattern), so a token works once even when it is presented twice at the same moment.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from .. import audit
from ..redis import AUDIT_LUA, END_SESSION_FUNCTION_LUA, Keys, get_redis, get_script

VERIFY, RESET = "verify", "reset"
LIFETIMES = {VERIFY: 24 * 3600, RESET: 30 * 60}
USER_ID = re.compile(r"[0-9a-f]{32}")

# Shared by the scripts that consume a token. The user's token hash (KEYS pointer) is deleted when the
# presented hash is the newest; returns true when it was, unexpired, and sent to the address the
# account (user_key) still has.
CONSUME_LUA = """
local function consume(pointer, user_key, token_hash, now)
  local rec = redis.call('HMGET', pointer, 'hash', 'email', 'expires_at')
  if not rec[1] or rec[1] ~= token_hash then return false end
  redis.call('DEL', pointer)
  if tonumber(rec[3]) <= tonumber(now) then return false end
  return redis.call('HGET', user_key, 'email') == rec[2]
end
"""


def hash_token(raw: str) -> str:
    """The SHA-256 under which a mailed token is stored."""
    return hashlib.sha256(raw.encode()).hexdigest()


def _user_of(raw: str) -> str | None:
    user_id, dot, rest = raw.partition(".")
    return user_id if dot and rest and USER_ID.fullmatch(user_id) else None


def issue_token(user_id: str, email: str, purpose: str) -> str:
    """A new token for this user and purpose; any older one of the same purpose stops working."""
    raw = f"{user_id}.{secrets.token_urlsafe(32)}"  # 256 random bits
    ttl = LIFETIMES[purpose]
    key = Keys.user_mail_token(user_id, purpose)
    pipe = get_redis().pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping={"hash": hash_token(raw), "email": email, "expires_at": f"{time.time() + ttl:.3f}"})
    pipe.expire(key, ttl)
    pipe.execute()
    return raw


def token_owner(raw: str, purpose: str) -> str | None:
    """The user a token would serve, without using it (None when it could not be consumed now)."""
    user_id = _user_of(raw)
    if user_id is None:
        return None
    token_hash, expires_at = get_redis().hmget(Keys.user_mail_token(user_id, purpose), "hash", "expires_at")
    if token_hash != hash_token(raw) or float(expires_at) <= time.time():
        return None
    return user_id


# KEYS[1] the user's verification token, KEYS[2] the user, KEYS[3] the email.verified audit entry's
# (AUDIT_LUA). ARGV: the presented hash, now, then the entry's. 1 (verified and recorded) or nil.
VERIFY_EMAIL_LUA = (
    CONSUME_LUA
    + AUDIT_LUA
    + """
if not consume(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return false end
redis.call('HSET', KEYS[2], 'email_verified', '1')
record_audit()
return 1
"""
)

# KEYS: 1 the user's reset token, 2 the user, 3 the user's session set, then the listing of every
# session (SESSIONS_LUA), then the password.reset audit entry's (AUDIT_LUA). ARGV: the presented hash,
# now, the new password's hash, then the listing, then the entry's.
# Consumes the token, stores the password and logs out from all devices in one step, recorded:
# tokenVersion + 1, every session ended. Whoever read the mail controls the address, so it also counts
# as verified, and a two-factor login locked by wrong codes is unlocked.
# Returns {ended session ids} (possibly empty), nil, or 'stale'.
RESET_PASSWORD_LUA = (
    END_SESSION_FUNCTION_LUA
    + CONSUME_LUA
    + AUDIT_LUA
    + """
local sessions = listed_sessions(4, 4)
if not still_current(sessions, KEYS[3], nil, false) then return 'stale' end
if not consume(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return false end
redis.call('HSET', KEYS[2], 'password_hash', ARGV[3], 'email_verified', '1')
redis.call('HDEL', KEYS[2], 'mfa_failures')
redis.call('HINCRBY', KEYS[2], 'token_version', 1)
record_audit()
return {1, end_sessions(sessions, KEYS[3], ARGV[2], false)}
"""
)


def verify_email(raw: str) -> str | None:
    """Use a verification token: the user id whose address is now verified, or None."""
    user_id = _user_of(raw)
    if user_id is None:
        return None
    entry = audit.new_entry("email.verified", subject=user_id, details={"method": "mail"})
    done = get_script(VERIFY_EMAIL_LUA)(
        keys=[Keys.user_mail_token(user_id, VERIFY), Keys.user(user_id), *audit.script_keys(entry)],
        args=[hash_token(raw), f"{time.time():.3f}", *audit.script_args(entry)],
    )
    if not done:
        return None
    audit.complete(entry)
    return user_id


def reset_password(raw: str, password_hash: str) -> tuple[str, list[str]] | None:
    """Use a reset token: store the new password hash and end every session; (user id, ended sessions)."""
    from .sessions import run_listed

    user_id = _user_of(raw)
    if user_id is None:
        return None
    client = get_redis()
    entry = audit.new_entry("password.reset", subject=user_id, details={"method": "mail"})
    script = get_script(RESET_PASSWORD_LUA)
    result = run_listed(
        lambda listing, args: script(
            keys=[
                Keys.user_mail_token(user_id, RESET),
                Keys.user(user_id),
                Keys.user_sessions(user_id),
                *listing,
                *audit.script_keys(entry),
            ],
            args=[hash_token(raw), f"{time.time():.3f}", password_hash, *args, *audit.script_args(entry)],
        ),
        user_id,
        lambda: sorted(client.smembers(Keys.user_sessions(user_id))),
    )
    if not result:
        return None
    audit.complete(entry)
    return user_id, list(result[1])


def forget_tokens(user_id: str, purpose: str) -> None:
    """Invalidate the user's outstanding token of this purpose (e.g. a reset link after a password change)."""
    get_redis().delete(Keys.user_mail_token(user_id, purpose))
