"""Authorization codes: made at the authorization endpoint, redeemed once at the token endpoint.

A code lives CODE_SECONDS and is bound to its client, its redirect URI, its PKCE challenge (S256), its nonce and
scope, the user and the browser session that authorized it, and the id of the client session it will start. Only
its SHA-256 is stored, as one key (one hash slot on a Redis Cluster). Taking it is one Lua step: the first taker
marks it used and keeps the record USED_KEPT_SECONDS longer; a later taker finds it used, marks it reused, and the
session the first use started is ended (with it every token issued from the code). The first use checks the mark
once its session has started, so a second use that comes in between is caught either way.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass

from authlib.oidc.core import AuthorizationCodeMixin

from ..auth import sessions
from ..redis import Keys, get_redis, get_script

CODE_SECONDS = 60
USED_KEPT_SECONDS = 600  # a second use after the code's 60 s still ends what the first started

# KEYS[1] the code. ARGV: now, seconds to keep a used code. 'taken' (first use), 'reused' (a later one: now
# marked), or 'gone' (unknown or expired).
TAKE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
if redis.call('HEXISTS', KEYS[1], 'used_at') == 1 then
  redis.call('HSET', KEYS[1], 'reused_at', ARGV[1])
  return 'reused'
end
redis.call('HSET', KEYS[1], 'used_at', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 'taken'
"""


@dataclass(frozen=True)
class AuthorizationCode(AuthorizationCodeMixin):
    """A code's record: what it was issued for (Authlib's authorization code model)."""

    code_hash: str
    client_id: str
    redirect_uri: str | None  # as the request gave it: the token request must repeat it then
    scope: str
    code_challenge: str
    code_challenge_method: str
    nonce: str | None
    user_id: str
    authorized_from: str  # the browser session
    auth_time: float  # when the user signed in there
    amr: tuple[str, ...]
    ip: str | None  # the browser's address
    session_id: str  # the client session its use starts
    used: bool = False

    def get_redirect_uri(self) -> str | None:
        """The redirect URI the authorization request named."""
        return self.redirect_uri

    def get_scope(self) -> str:
        """The scope granted."""
        return self.scope

    def get_nonce(self) -> str | None:
        """The nonce the authorization request carried."""
        return self.nonce

    def get_auth_time(self) -> int:
        """When the user signed in (seconds since the epoch)."""
        return int(self.auth_time)

    def get_amr(self) -> list[str]:
        """How the user signed in (RFC 8176)."""
        return list(self.amr)


def hash_code(code: str) -> str:
    """The SHA-256 a code is stored under (the code itself never is)."""
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def save(code: str, client_id: str, redirect_uri: str | None, scope: str, challenge: str, nonce: str | None, browser):
    """Store a new code for `browser` (a BrowserSession) to redeem within CODE_SECONDS."""
    record = {
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "scope": scope,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "nonce": nonce,
        "user_id": browser.user_id,
        "authorized_from": browser.session_id,
        "auth_time": browser.auth_time,
        "amr": list(browser.amr),
        "ip": browser.ip,
        "session_id": uuid.uuid4().hex,
    }
    key = Keys.authorization_code(hash_code(code))
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(key, "record", json.dumps(record))
    pipe.expire(key, CODE_SECONDS)
    pipe.execute()


def find(code: str, client_id: str) -> AuthorizationCode | None:
    """The code, if it is alive and was issued to this client. A code used already is a second use: it is taken
    as one (what its first use started ends) and is None."""
    if not isinstance(code, str) or not code:
        return None
    found = _read(hash_code(code))
    if found is None or found.client_id != client_id:
        return None
    if found.used:
        take(found)  # answers reused, and ends the first use's session
        return None
    return found


def _read(code_hash: str) -> AuthorizationCode | None:
    stored = get_redis().hgetall(Keys.authorization_code(code_hash))
    if "record" not in stored:
        return None
    record = json.loads(stored["record"])
    return AuthorizationCode(code_hash=code_hash, amr=tuple(record.pop("amr")), used="used_at" in stored, **record)


def take(code: AuthorizationCode) -> bool:
    """Use the code: True for its first use; False for a later one, whose first use's session (and every token
    issued from it) ends now."""
    outcome = get_script(TAKE_LUA)(
        keys=[Keys.authorization_code(code.code_hash)], args=[time.time(), USED_KEPT_SECONDS]
    )
    if outcome == "taken":
        return True
    if outcome == "reused":
        sessions.end_session(code.user_id, code.session_id, "session.revoked")
    return False


def reused(code: AuthorizationCode) -> bool:
    """Whether a second use of the code has come (after its first use took it)."""
    return bool(get_redis().hexists(Keys.authorization_code(code.code_hash), "reused_at"))


def nonce_seen(client_id: str, nonce: str) -> bool:
    """Whether a code of this client issued within CODE_SECONDS carries this nonce (a replayed request)."""
    return bool(get_redis().exists(Keys.authorization_nonce(client_id, hash_code(nonce))))


def claim_nonce(client_id: str, nonce: str) -> bool:
    """Note the nonce as carried by a code now being issued; False when another code carries it already."""
    key = Keys.authorization_nonce(client_id, hash_code(nonce))
    return bool(get_redis().set(key, "1", nx=True, ex=CODE_SECONDS))
