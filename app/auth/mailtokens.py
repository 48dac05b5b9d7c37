"""Tokens sent by mail (e-mail verification, password reset): random, single-use, stored hashed.

Each token is 256 random bits; Redis keeps only its SHA-256, with the user, the address it was sent to
and its expiry. Per user and purpose only the newest token is valid: issuing one deletes the one
before. Consuming is an atomic step (the refresh-token pattern), so a token works once even when it is
presented twice at the same moment.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from ..redis import END_SESSION_FUNCTION_LUA, Keys, get_redis, get_script

VERIFY, RESET = "verify", "reset"
LIFETIMES = {VERIFY: 24 * 3600, RESET: 30 * 60}

# KEYS[1] the user's pointer to their newest token, KEYS[2] the new token's record.
# ARGV: token-key prefix, new hash, user id, e-mail, expires at (epoch s), ttl (s).
ISSUE_LUA = """
local previous = redis.call('GET', KEYS[1])
if previous then redis.call('DEL', ARGV[1] .. previous) end
redis.call('HSET', KEYS[2], 'user_id', ARGV[3], 'email', ARGV[4], 'expires_at', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[6])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[6])
return 1
"""

# Shared by the scripts that consume a token: checks it and deletes it, returning the user id, or
# false when it is unknown, expired, not the user's newest, or was sent to an address the account no
# longer has.
CONSUME_LUA = """
local function consume(token_key, purpose, token_hash, now)
  local rec = redis.call('HMGET', token_key, 'user_id', 'email', 'expires_at')
  local uid, email, expires = rec[1], rec[2], rec[3]
  if not uid then return false end
  local pointer = 'user:' .. uid .. ':mailtoken:' .. purpose
  local current = redis.call('GET', pointer)
  redis.call('DEL', token_key)
  if current ~= token_hash or tonumber(expires) <= tonumber(now) then return false end
  if redis.call('HGET', 'user:' .. uid, 'email') ~= email then return false end
  redis.call('DEL', pointer)
  return uid
end
"""


def hash_token(raw: str) -> str:
    """The SHA-256 under which a mailed token is stored."""
    return hashlib.sha256(raw.encode()).hexdigest()


def issue_token(user_id: str, email: str, purpose: str) -> str:
    """A new token for this user and purpose; any older one of the same purpose stops working."""
    raw = secrets.token_urlsafe(32)  # 256 bits
    token_hash, ttl = hash_token(raw), LIFETIMES[purpose]
    get_script(ISSUE_LUA)(
        keys=[Keys.user_mail_token(user_id, purpose), Keys.mail_token(purpose, token_hash)],
        args=[Keys.mail_token(purpose, ""), token_hash, user_id, email, f"{time.time() + ttl:.3f}", ttl],
    )
    return raw


def token_owner(raw: str, purpose: str) -> str | None:
    """The user a token would serve, without using it (None when it could not be consumed now)."""
    token_hash = hash_token(raw)
    client = get_redis()
    record = client.hmget(Keys.mail_token(purpose, token_hash), "user_id", "expires_at")
    user_id, expires_at = record
    if not user_id or float(expires_at) <= time.time():
        return None
    return user_id if client.get(Keys.user_mail_token(user_id, purpose)) == token_hash else None


# KEYS[1] the token's record. ARGV: its hash, now. The user id, or nil.
VERIFY_EMAIL_LUA = (
    CONSUME_LUA
    + """
local uid = consume(KEYS[1], 'verify', ARGV[1], ARGV[2])
if not uid then return false end
redis.call('HSET', 'user:' .. uid, 'email_verified', '1')
return uid
"""
)

# KEYS[1] the token's record. ARGV: its hash, now, the new password's hash.
# Consumes the token, stores the password and logs out from all devices in one step: tokenVersion + 1,
# every session ended. Whoever read the mail controls the address, so it also counts as verified.
# Returns {user id, {ended session ids}}, or nil.
RESET_PASSWORD_LUA = (
    END_SESSION_FUNCTION_LUA
    + CONSUME_LUA
    + """
local uid = consume(KEYS[1], 'reset', ARGV[1], ARGV[2])
if not uid then return false end
local ukey = 'user:' .. uid
redis.call('HSET', ukey, 'password_hash', ARGV[3], 'email_verified', '1')
redis.call('HINCRBY', ukey, 'token_version', 1)
local ended = {}
for _, sid in ipairs(redis.call('SMEMBERS', ukey .. ':sessions')) do
  end_session(sid, ARGV[2])
  table.insert(ended, sid)
end
return {uid, ended}
"""
)


def verify_email(raw: str) -> str | None:
    """Use a verification token: the user id whose address is now verified, or None."""
    token_hash = hash_token(raw)
    return get_script(VERIFY_EMAIL_LUA)(
        keys=[Keys.mail_token(VERIFY, token_hash)], args=[token_hash, f"{time.time():.3f}"]
    )


def reset_password(raw: str, password_hash: str) -> tuple[str, list[str]] | None:
    """Use a reset token: store the new password hash and end every session; (user id, ended sessions)."""
    token_hash = hash_token(raw)
    result = get_script(RESET_PASSWORD_LUA)(
        keys=[Keys.mail_token(RESET, token_hash)], args=[token_hash, f"{time.time():.3f}", password_hash]
    )
    return (result[0], list(result[1])) if result else None


def forget_tokens(user_id: str, purpose: str) -> None:
    """Invalidate the user's outstanding token of this purpose (e.g. a reset link after a password change)."""
    client = get_redis()
    current = client.get(Keys.user_mail_token(user_id, purpose))
    if current:
        client.delete(Keys.mail_token(purpose, current), Keys.user_mail_token(user_id, purpose))
