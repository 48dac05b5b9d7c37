"""Sessions (one per login, i.e. per device) and their refresh-token families.

A session id is also its family id: every refresh token of one rotation chain points at it, and
ending the session revokes the whole family. Only SHA-256 hashes of refresh tokens are stored.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
import uuid
from dataclasses import dataclass

from blinker import Namespace
from flask import current_app

from .. import audit
from ..errors import ApiError
from ..http import rfc3339
from ..redis import Keys, get_redis, get_script, get_scripts

_signals = Namespace()
#: Sent with `user_id` and `session_ids` whenever sessions end, so live connections can be closed.
sessions_ended = _signals.signal("sessions-ended")

TOUCH_INTERVAL_SECONDS = 60
RECENT_AUTHENTICATION_SECONDS = 5 * 60  # a login or re-authentication this recent may change MFA
DEVICE_MAX = 200
STALE_ATTEMPTS = 10  # readings of a user's sessions before giving up on a step they keep changing under
ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class ClientGrant:
    """What makes a session a client's: the client, the browser session the user authorized it from, the scope
    granted, and how and when the user had signed in there (the client session's own authentication)."""

    client_id: str
    authorized_from: str
    scope: str
    authenticated_at: float
    amr: tuple[str, ...]


@dataclass(frozen=True)
class IssuedSession:
    """A new session and the first refresh token of its family."""

    session_id: str
    refresh_token: str
    refresh_expires_in: int


@dataclass(frozen=True)
class Rotation:
    """The outcome of presenting a refresh token, and what it yields."""

    # rotated | grace: a new token; reused: a rotated-away token while its session lived (that session is
    # now ended); ended: a token revoked when its session ended earlier; invalid: unknown or expired.
    outcome: str
    user_id: str | None = None
    session_id: str | None = None
    role: str | None = None
    token_version: int | None = None
    refresh_token: str | None = None


def hash_token(raw: str) -> str:
    """The SHA-256 under which a refresh token is stored (the token itself never is)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def _new_refresh_token(user_id: str, session_id: str) -> tuple[str, str]:
    """`<user id>.<session id>.<256 random bits>`: the ids tell the server where the record lives.

    Everything of one user shares a hash slot on a Redis Cluster, so a token that names its user (and
    family) lets one script find, rotate or revoke it. The hash covers the whole token, so changing
    the ids makes a token that matches no record.
    """
    raw = f"{user_id}.{session_id}.{secrets.token_urlsafe(32)}"
    return raw, hash_token(raw)


def parse_refresh_token(raw: str) -> tuple[str, str] | None:
    """(user id, session id) that a refresh token names, or None when it is not of our form."""
    parts = raw.split(".")
    if len(parts) != 3 or not ID.fullmatch(parts[0]) or not ID.fullmatch(parts[1]) or not parts[2]:
        return None
    return parts[0], parts[1]


def _ttl() -> int:
    return current_app.config["SETTINGS"].refresh_token_ttl


def _now() -> str:
    return f"{time.time():.3f}"


def session_layout(client, user_id: str, session_ids: list[str], purge: bool = False) -> tuple[list[str], list]:
    """The KEYS and ARGV that list these sessions for the session-ending Lua (SESSIONS_LUA in app/redis.py).

    One round trip: each family's live tokens (with `purge`, every token, to delete their records).
    """
    pipe = client.pipeline(transaction=False)
    for session_id in session_ids:
        pipe.smembers(
            Keys.session_tokens(user_id, session_id) if purge else Keys.session_live_tokens(user_id, session_id)
        )
    members = pipe.execute() if session_ids else []
    keys: list[str] = []
    args: list = [len(session_ids)]
    for session_id, hashes in zip(session_ids, members, strict=True):
        hashes = sorted(hashes)
        keys += [
            Keys.session(user_id, session_id),
            Keys.session_tokens(user_id, session_id),
            Keys.session_live_tokens(user_id, session_id),
            *(Keys.refresh_token(user_id, token_hash) for token_hash in hashes),
        ]
        args += [session_id, len(hashes), *hashes]
    return keys, args


def run_listed(run, user_id: str, session_ids, purge: bool = False, listed: bool = True):
    """Call `run(keys, args)` with the listing of `session_ids()` until the script finds it current.

    `run` returns the script's answer; 'stale' means a login or refresh changed the sessions between
    reading and the script, so they are read again. With `listed=False` the first call goes without a
    listing (the script asks for one only when it needs it).
    """
    client = get_redis()
    keys, args = ([], [0]) if not listed else session_layout(client, user_id, session_ids(), purge)
    for _ in range(STALE_ATTEMPTS):
        result = run(keys, args)
        if not _is_stale(result):
            return result
        keys, args = session_layout(client, user_id, session_ids(), purge)
    raise ApiError(503, "unavailable", "The sessions kept changing; try again.")


def _is_stale(result) -> bool:
    return result == "stale" or (isinstance(result, list) and result[:1] == ["stale"])


def _all_sessions(user_id: str):
    return lambda: sorted(get_redis().smembers(Keys.user_sessions(user_id)))


def amr_of(login: dict) -> list[str]:
    """How a login proved who the user is, as RFC 8176 names authentication methods: `pwd` (a password), `fed`
    (another provider, or a trusted issuer's token), `hwk` and `user` (a passkey: a key held by a device, used
    by the user), then `otp` and `mfa` after a TOTP code, `mfa` after a recovery code (no RFC 8176 name)."""
    first = {"password": ["pwd"], "passkey": ["hwk", "user"], "oauth": ["fed"], "token_exchange": ["fed"]}
    methods = list(first.get(login.get("method", "password"), []))
    second = login.get("second_factor")
    if second == "totp":
        methods += ["otp", "mfa"]
    elif second == "recovery_code":
        methods += ["mfa"]
    return methods


def start_session(
    user_id: str,
    device: str | None,
    ip: str | None,
    login: dict | None = None,
    proves_factor: bool = True,
    client: ClientGrant | None = None,
    session_id: str | None = None,
) -> IssuedSession:
    """A new session (device) with the first refresh token of its family, written in one transaction with
    its login.succeeded audit entry; `login` says how the user logged in (the entry's details).

    `proves_factor=False` (a trusted issuer's token exchange): the login proved no factor of this service,
    so the session is not recently authenticated, and what needs a fresh proof (TOTP setup, a new passkey)
    needs a password or a passkey, which a user from an issuer has neither of.

    `client`: the session is an authorization the user gave a client (an OpenID relying party), entered in the
    user's index of client sessions in the same transaction; `session_id` is then chosen by the caller (the
    authorization code names it before the session starts).
    """
    session_id = session_id or uuid.uuid4().hex
    raw, token_hash = _new_refresh_token(user_id, session_id)
    now, ttl = time.time(), _ttl()
    expires_at = f"{now + ttl:.3f}"
    stamp = f"{now:.3f}"
    device = (device or "unknown device")[:DEVICE_MAX]
    details = {"method": "password", **(login or {}), "session_id": session_id, "device": device}
    entry = audit.new_entry("login.succeeded", subject=user_id, details=details)
    pipe = get_redis().pipeline(transaction=True)
    record = Keys.refresh_token(user_id, token_hash)
    pipe.hset(
        record,
        mapping={
            "user_id": user_id,
            "family_id": session_id,
            "created_at": stamp,
            "expires_at": expires_at,
            "revoked_at": "",
        },
    )
    pipe.expire(record, ttl)
    for family in (Keys.session_tokens(user_id, session_id), Keys.session_live_tokens(user_id, session_id)):
        pipe.sadd(family, token_hash)
        pipe.expire(family, ttl)
    authenticated_at = stamp if proves_factor else ""  # a refresh keeps it: only proving a factor renews it
    session = {
        "id": session_id,
        "user_id": user_id,
        "device": device,
        "ip": ip or "",
        "created_at": stamp,
        "last_used_at": stamp,
        "authenticated_at": authenticated_at,
        "amr": " ".join(amr_of(login or {})),
        "expires_at": expires_at,
        "current_hash": token_hash,
        "previous_hash": "",
    }
    if client is not None:
        session.update(
            client_id=client.client_id,
            authorized_from=client.authorized_from,
            scope=client.scope,
            authenticated_at=f"{client.authenticated_at:.3f}",  # when the user signed in, not when the client came
            amr=" ".join(client.amr),
        )
        pipe.hset(Keys.client_sessions(user_id), session_id, client.client_id)
        pipe.expire(Keys.client_sessions(user_id), ttl)  # outlives every client session (see keep_client_index)
    pipe.hset(Keys.session(user_id, session_id), mapping=session)
    pipe.expire(Keys.session(user_id, session_id), ttl)
    pipe.sadd(Keys.user_sessions(user_id), session_id)
    audit.add_to_transaction(pipe, entry)
    pipe.execute()
    audit.complete(entry)
    return IssuedSession(session_id, raw, ttl)


def keep_client_index(user_id: str) -> None:
    """A client session was refreshed (and lives another refresh TTL): its index lives as long."""
    get_redis().expire(Keys.client_sessions(user_id), _ttl())


def client_sessions(user_id: str) -> dict[str, str]:
    """The user's client sessions, as the index has them (session id -> client id); ended ones included until the
    index forgets them."""
    return get_redis().hgetall(Keys.client_sessions(user_id))


def session_record(user_id: str, session_id: str) -> dict:
    """The session's stored record ({} when there is none)."""
    if not ID.fullmatch(user_id or "") or not ID.fullmatch(session_id or ""):
        return {}
    return get_redis().hgetall(Keys.session(user_id, session_id))


def end_sessions_authorized_from(user_id: str, browser_session_id: str) -> list[str]:
    """End the client sessions the user authorized from this browser session (it logged out); the ended ids."""
    client_session_ids = sorted(client_sessions(user_id))
    pipe = get_redis().pipeline(transaction=False)
    for session_id in client_session_ids:
        pipe.hget(Keys.session(user_id, session_id), "authorized_from")
    origins = pipe.execute() if client_session_ids else []
    authorized = [sid for sid, origin in zip(client_session_ids, origins, strict=True) if origin == browser_session_id]
    return [sid for sid in authorized if end_session(user_id, sid, "session.revoked")]


def rotate_refresh_token(raw: str) -> Rotation:
    """Atomically trade a refresh token for a new one of the same family, or detect its reuse.

    A revoked token is reuse (the session ends now) only while its session is alive; the token of a
    session that had already ended is answered as `ended`, and nothing is revoked again.
    """
    named = parse_refresh_token(raw)
    if named is None:
        return Rotation("invalid")
    user_id, session_id = named
    new_raw, new_hash = _new_refresh_token(user_id, session_id)
    settings = current_app.config["SETTINGS"]
    now, ttl = time.time(), settings.refresh_token_ttl
    old_hash = hash_token(raw)
    fixed_keys = [
        Keys.refresh_token(user_id, old_hash),
        Keys.refresh_token(user_id, new_hash),
        Keys.session(user_id, session_id),
        Keys.session_tokens(user_id, session_id),
        Keys.session_live_tokens(user_id, session_id),
        Keys.user(user_id),
        Keys.user_sessions(user_id),
    ]
    fixed_args = [f"{now:.3f}", f"{now + ttl:.3f}", ttl, settings.refresh_reuse_grace, old_hash, new_hash, session_id]
    # Recorded only when the token turns out to be reused; the actor is the service, which ends the session.
    entry = audit.new_entry(
        "refresh.reuse_detected", subject=user_id, actor=audit.SYSTEM, details={"session_id": session_id}
    )
    rotate = get_scripts().rotate_refresh
    result = run_listed(
        lambda keys, args: rotate(
            keys=fixed_keys + keys + audit.script_keys(entry), args=fixed_args + args + audit.script_args(entry)
        ),
        user_id,
        lambda: [session_id],
        listed=False,
    )
    outcome = result[0]
    if outcome == "invalid":
        return Rotation("invalid")
    if outcome == "ended":
        return Rotation("ended", result[1], result[2])
    if outcome == "reused":
        audit.complete(entry)
        sessions_ended.send(current_app._get_current_object(), user_id=result[1], session_ids=[result[2]])
        return Rotation("reused", result[1], result[2])
    return Rotation(outcome, result[1], result[2], result[3] or "user", int(result[4] or 0), new_raw)


# KEYS: 1 the session, 2 the record of its current refresh token, 3 the new token's record, 4 its token set,
# 5 its live-token set. ARGV: now, new expiry (epoch s), ttl (s), the current token's hash, the new hash, the
# active organization's id ('' for none).
# A refresh without a presented token: the current token is revoked (the one before it stays good for the
# grace period, as after a refresh), a new one joins the family, and the session keeps the organization.
# 'gone' when the session ended, 'stale' when a refresh changed its current token since it was read.
SWITCH_ORG_LUA = """
local current = redis.call('HGET', KEYS[1], 'current_hash')
if not current then return 'gone' end
if current ~= ARGV[4] then return 'stale' end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'revoked_at', ARGV[1])
end
redis.call('SREM', KEYS[5], ARGV[4])
local uid = redis.call('HGET', KEYS[1], 'user_id')
redis.call('HSET', KEYS[3], 'user_id', uid, 'family_id', redis.call('HGET', KEYS[1], 'id'), 'created_at', ARGV[1],
           'expires_at', ARGV[2], 'revoked_at', '')
redis.call('EXPIRE', KEYS[3], ARGV[3])
for _, set in ipairs({KEYS[4], KEYS[5]}) do
  redis.call('SADD', set, ARGV[5])
  redis.call('EXPIRE', set, ARGV[3])
end
redis.call('HSET', KEYS[1], 'previous_hash', ARGV[4], 'current_hash', ARGV[5], 'last_used_at', ARGV[1],
           'expires_at', ARGV[2], 'org_id', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 'switched'
"""

# KEYS[1] the session. ARGV: the organization it had. Clears the session's organization if it is still that one.
FORGET_ORG_LUA = """
if redis.call('HGET', KEYS[1], 'org_id') == ARGV[1] then redis.call('HSET', KEYS[1], 'org_id', '') end
return 1
"""


def switch_org(user_id: str, session_id: str, org_id: str | None) -> IssuedSession | None:
    """Make `org_id` (None: none) the session's active organization and rotate its refresh token as a refresh
    does; the new token, or None when the session has ended. The caller has checked the membership."""
    ttl = _ttl()
    script = get_script(SWITCH_ORG_LUA)
    for _ in range(STALE_ATTEMPTS):
        current = get_redis().hget(Keys.session(user_id, session_id), "current_hash")
        if current is None:
            return None
        raw, new_hash = _new_refresh_token(user_id, session_id)
        now = time.time()
        keys = [
            Keys.session(user_id, session_id),
            Keys.refresh_token(user_id, current),
            Keys.refresh_token(user_id, new_hash),
            Keys.session_tokens(user_id, session_id),
            Keys.session_live_tokens(user_id, session_id),
        ]
        args = [f"{now:.3f}", f"{now + ttl:.3f}", ttl, current, new_hash, org_id or ""]
        outcome = script(keys=keys, args=args)
        if outcome == "gone":
            return None
        if outcome == "switched":
            return IssuedSession(session_id, raw, ttl)
    raise ApiError(503, "unavailable", "The session kept changing; try again.")


def active_org(user_id: str, session_id: str) -> tuple[str, str] | None:
    """(org id, role) of the session's active organization while the user is still a member of it, else None.

    Read when an access token is issued, so that a removal or a role change applies to the next token. An
    organization the user no longer belongs to is forgotten by the session (a later return does not bring it
    back unasked)."""
    client = get_redis()
    org_id = client.hget(Keys.session(user_id, session_id), "org_id")
    if not org_id:
        return None
    role = member_role(client.hget(Keys.org_members(org_id), user_id))
    if role is None:
        get_script(FORGET_ORG_LUA)(keys=[Keys.session(user_id, session_id)], args=[org_id])
        return None
    return org_id, role


def member_role(stored: str | None) -> str | None:
    """The role in an organization's members-hash entry {"role", "joined_at"} (None for none or a broken one)."""
    try:
        member = json.loads(stored) if stored else None
    except ValueError:
        return None
    role = member.get("role") if isinstance(member, dict) else None
    return role if isinstance(role, str) else None


def is_client_refresh_token(raw: str) -> bool:
    """Whether a refresh token names a client's session (refreshed at the token endpoint by its client only)."""
    named = parse_refresh_token(raw)
    return named is not None and bool(get_redis().hget(Keys.session(*named), "client_id"))


def session_of_refresh_token(raw: str) -> tuple[str, str] | None:
    """(user id, session id) of an unrevoked, unexpired refresh token."""
    named = parse_refresh_token(raw)
    if named is None:
        return None
    record = get_redis().hgetall(Keys.refresh_token(named[0], hash_token(raw)))
    if not record or record.get("revoked_at") or float(record["expires_at"]) <= time.time():
        return None
    return record["user_id"], record["family_id"]


def session_check(user_id: str, session_id: str) -> tuple[list, list]:
    """The keys and arguments of the session check (VERIFY_ACCESS), for a round trip that carries more."""
    return [Keys.user(user_id), Keys.session(user_id, session_id)], [user_id, _now(), TOUCH_INTERVAL_SECONDS]


def verify_session(user_id: str, session_id: str, token_version: int, scripts=None) -> dict | None:
    """One round trip: the token's version is the user's current one and its session still exists.

    Returns the user's public fields (`U`) when both hold, else None.
    """
    keys, args = session_check(user_id, session_id)
    return checked_user(user_id, token_version, (scripts or get_scripts()).verify_access(keys=keys, args=args))


def verify_session_reading(user_id: str, session_id: str, token_version: int, reads: list) -> tuple[dict | None, list]:
    """`verify_session`, with read commands (name, args, kwargs) sent in the same round trip where the session
    checks of concurrent requests travel together (one Redis, under gevent): the user's public fields or None,
    and each read's answer (or its error as the value); no answers where they did not go together."""
    scripts = get_scripts()
    together = getattr(scripts.verify_access, "with_reads", None)
    if together is None or not reads:
        return verify_session(user_id, session_id, token_version, scripts), []
    keys, args = session_check(user_id, session_id)
    answer, answers = together(keys, args, reads)
    return checked_user(user_id, token_version, answer), answers


def checked_user(user_id: str, token_version: int, answer: list) -> dict | None:
    """The user's public fields from the session check's answer, or None unless the session is current."""
    version, session_ok, *user = answer
    if not session_ok or version is None or int(version) != token_version:
        return None
    email, role, verified, mfa, issuer, subject = user
    found = {"id": user_id, "email": email, "role": role, "email_verified": verified == "1", "mfa_enabled": mfa == 1}
    if issuer:  # a user from a trusted issuer (see users.public_user)
        found.update(email=email or None, external={"issuer": issuer, "sub": subject})
    return found


def verify_client_session(user_id: str, session_id: str, scripts=None) -> tuple[dict, int] | None:
    """For a client's access token, which names no token version: the user's public fields and current version
    when the session still exists (ending every session, as logout-all and a reset do, deletes it)."""
    keys, args = session_check(user_id, session_id)
    answer = (scripts or get_scripts()).verify_access(keys=keys, args=args)
    if answer[0] is None:
        return None
    user = checked_user(user_id, int(answer[0]), answer)
    return (user, int(answer[0])) if user is not None else None


def session_is_valid(user_id: str, session_id: str, token_version: int, scripts=None) -> bool:
    """Whether the session still exists and the token version is current."""
    return verify_session(user_id, session_id, token_version, scripts) is not None


def end_session(user_id: str, session_id: str, entry_type: str = "session.revoked") -> bool:
    """End one of the user's sessions: revoke its family, delete its record, and record it (`logout` when the
    session ends itself, `session.revoked` otherwise) in the same step. False if it was gone already."""
    entry = audit.new_entry(entry_type, subject=user_id, details={"session_id": session_id})
    script = get_scripts().end_session
    existed = run_listed(
        lambda keys, args: script(
            keys=[Keys.user_sessions(user_id), *keys, *audit.script_keys(entry)],
            args=[_now(), *args, *audit.script_args(entry)],
        ),
        user_id,
        lambda: [session_id],
    )
    if existed:
        audit.complete(entry)
        sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=[session_id])
    return bool(existed)


def end_other_sessions(user_id: str, keep_session_id: str) -> list[str]:
    """End every session of the user but one (after a password change); returns the ended ids."""
    script = get_scripts().end_other_sessions
    ended = run_listed(
        lambda keys, args: script(
            keys=[Keys.user(user_id), Keys.user_sessions(user_id), *keys], args=[_now(), keep_session_id, *args]
        ),
        user_id,
        lambda: [sid for sid in _all_sessions(user_id)() if sid != keep_session_id],
    )
    if ended:
        sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=list(ended))
    return list(ended)


def logout_all(user_id: str, entry_type: str = "session.revoked") -> int:
    """tokenVersion + 1, every refresh token revoked, every session deleted, and recorded in the same step
    (`logout` when the user logs out everywhere, `session.revoked` when an administrator or the CLI ends
    their sessions); returns the new version."""
    entry = audit.new_entry(entry_type, subject=user_id, details={"all_sessions": True})
    script = get_scripts().logout_all
    version, ended = run_listed(
        lambda keys, args: script(
            keys=[Keys.user(user_id), Keys.user_sessions(user_id), *keys, *audit.script_keys(entry)],
            args=[_now(), *args, *audit.script_args(entry)],
        ),
        user_id,
        _all_sessions(user_id),
    )
    audit.complete(entry)
    sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=list(ended), whole_user=True)
    return int(version)


def list_sessions(user_id: str, current_session_id: str | None) -> list[dict]:
    """The user's live sessions, most recently used first (`S` in docs/api.md)."""
    client = get_redis()
    session_ids = sorted(client.smembers(Keys.user_sessions(user_id)))
    pipe = client.pipeline(transaction=False)
    for session_id in session_ids:
        pipe.hgetall(Keys.session(user_id, session_id))
    records = pipe.execute()
    gone = [sid for sid, record in zip(session_ids, records, strict=False) if not record]
    if gone:  # expired sessions leave their id behind in the set
        client.srem(Keys.user_sessions(user_id), *gone)
    sessions = [
        {
            "id": record["id"],
            "device": record["device"],
            "created_at": rfc3339(record["created_at"]),
            "last_used_at": rfc3339(record["last_used_at"]),
            "ip": record["ip"] or None,
            "current": record["id"] == current_session_id,
        }
        for record in records
        if record
    ]
    return sorted(sessions, key=lambda s: s["last_used_at"], reverse=True)


# KEYS[1] the session. ARGV: now. Only an existing session is marked (never one recreated by the write).
MARK_AUTHENTICATED_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'authenticated_at', ARGV[1])
return 1
"""


def mark_authenticated(user_id: str, session_id: str) -> bool:
    """The session's owner has just proved a factor again; False when the session is gone."""
    return bool(get_script(MARK_AUTHENTICATED_LUA)(keys=[Keys.session(user_id, session_id)], args=[_now()]))


def recently_authenticated(user_id: str, session_id: str) -> bool:
    """Whether this session proved a factor (login or re-authentication) in the last five minutes."""
    stamp = get_redis().hget(Keys.session(user_id, session_id), "authenticated_at")
    return bool(stamp) and time.time() - float(stamp) <= RECENT_AUTHENTICATION_SECONDS


def session_exists(user_id: str, session_id: str) -> bool:
    """Whether the user has a session with this id."""
    return bool(get_redis().exists(Keys.session(user_id, session_id)))
