"""Sessions (one per login, i.e. per device) and their refresh-token families.

A session id is also its family id: every refresh token of one rotation chain points at it, and
ending the session revokes the whole family. Only SHA-256 hashes of refresh tokens are stored.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from dataclasses import dataclass

from blinker import Namespace
from flask import current_app

from ..http import rfc3339
from ..redis import Keys, get_redis, get_scripts

_signals = Namespace()
#: Sent with `user_id` and `session_ids` whenever sessions end, so live connections can be closed.
sessions_ended = _signals.signal("sessions-ended")

TOUCH_INTERVAL_SECONDS = 60
DEVICE_MAX = 200


@dataclass(frozen=True)
class IssuedSession:
    """A new session and the first refresh token of its family."""

    session_id: str
    refresh_token: str
    refresh_expires_in: int


@dataclass(frozen=True)
class Rotation:
    """The outcome of presenting a refresh token, and what it yields."""

    outcome: str  # rotated | grace | reused | invalid
    user_id: str | None = None
    session_id: str | None = None
    role: str | None = None
    token_version: int | None = None
    refresh_token: str | None = None


def hash_token(raw: str) -> str:
    """The SHA-256 under which a refresh token is stored (the token itself never is)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def _new_refresh_token() -> tuple[str, str]:
    raw = secrets.token_urlsafe(32)  # 256 bits
    return raw, hash_token(raw)


def _ttl() -> int:
    return current_app.config["SETTINGS"].refresh_token_ttl


def start_session(user_id: str, device: str | None, ip: str | None) -> IssuedSession:
    """A new session (device) with the first refresh token of its family, written in one transaction."""
    session_id = uuid.uuid4().hex
    raw, token_hash = _new_refresh_token()
    now, ttl = time.time(), _ttl()
    expires_at = f"{now + ttl:.3f}"
    stamp = f"{now:.3f}"
    pipe = get_redis().pipeline(transaction=True)
    pipe.hset(
        Keys.refresh_token(token_hash),
        mapping={
            "user_id": user_id,
            "family_id": session_id,
            "created_at": stamp,
            "expires_at": expires_at,
            "revoked_at": "",
        },
    )
    pipe.expire(Keys.refresh_token(token_hash), ttl)
    pipe.sadd(Keys.session_tokens(session_id), token_hash)
    pipe.expire(Keys.session_tokens(session_id), ttl)
    pipe.hset(
        Keys.session(session_id),
        mapping={
            "id": session_id,
            "user_id": user_id,
            "device": (device or "unknown device")[:DEVICE_MAX],
            "ip": ip or "",
            "created_at": stamp,
            "last_used_at": stamp,
            "expires_at": expires_at,
            "current_hash": token_hash,
            "previous_hash": "",
        },
    )
    pipe.expire(Keys.session(session_id), ttl)
    pipe.sadd(Keys.user_sessions(user_id), session_id)
    pipe.execute()
    return IssuedSession(session_id, raw, ttl)


def rotate_refresh_token(raw: str) -> Rotation:
    """Atomically trade a refresh token for a new one of the same family, or detect its reuse."""
    new_raw, new_hash = _new_refresh_token()
    settings = current_app.config["SETTINGS"]
    now, ttl = time.time(), settings.refresh_token_ttl
    old_hash = hash_token(raw)
    result = get_scripts().rotate_refresh(
        keys=[Keys.refresh_token(old_hash), Keys.refresh_token(new_hash)],
        args=[f"{now:.3f}", f"{now + ttl:.3f}", ttl, settings.refresh_reuse_grace, old_hash, new_hash],
    )
    outcome = result[0]
    if outcome == "invalid":
        return Rotation("invalid")
    if outcome == "reused":
        sessions_ended.send(current_app._get_current_object(), user_id=result[1], session_ids=[result[2]])
        return Rotation("reused", result[1], result[2])
    return Rotation(outcome, result[1], result[2], result[3] or "user", int(result[4] or 0), new_raw)


def session_of_refresh_token(raw: str) -> tuple[str, str] | None:
    """(user id, session id) of an unrevoked, unexpired refresh token."""
    record = get_redis().hgetall(Keys.refresh_token(hash_token(raw)))
    if not record or record.get("revoked_at") or float(record["expires_at"]) <= time.time():
        return None
    return record["user_id"], record["family_id"]


def verify_session(user_id: str, session_id: str, token_version: int, scripts=None) -> dict | None:
    """One round trip: the token's version is the user's current one and its session still exists.

    Returns the user's public fields (`U`) when both hold, else None.
    """
    version, session_ok, *user = (scripts or get_scripts()).verify_access(
        keys=[Keys.user(user_id), Keys.session(session_id)],
        args=[user_id, f"{time.time():.3f}", TOUCH_INTERVAL_SECONDS],
    )
    if not session_ok or version is None or int(version) != token_version:
        return None
    email, role, verified, mfa = user
    return {"id": user_id, "email": email, "role": role, "email_verified": verified == "1", "mfa_enabled": mfa == 1}


def session_is_valid(user_id: str, session_id: str, token_version: int, scripts=None) -> bool:
    """Whether the session still exists and the token version is current."""
    return verify_session(user_id, session_id, token_version, scripts) is not None


def end_session(session_id: str) -> str | None:
    """End one session: revoke its family, delete its record. Returns the owner, if it existed."""
    user_id = get_scripts().end_session(args=[session_id, f"{time.time():.3f}"])
    if user_id:
        sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=[session_id])
    return user_id


def end_other_sessions(user_id: str, keep_session_id: str) -> list[str]:
    """End every session of the user but one (after a password change); returns the ended ids."""
    ended = get_scripts().end_other_sessions(
        keys=[Keys.user(user_id), Keys.user_sessions(user_id)], args=[f"{time.time():.3f}", keep_session_id]
    )
    if ended:
        sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=list(ended))
    return list(ended)


def logout_all(user_id: str) -> int:
    """tokenVersion + 1, every refresh token revoked, every session deleted; returns the new version."""
    version, ended = get_scripts().logout_all(
        keys=[Keys.user(user_id), Keys.user_sessions(user_id)], args=[f"{time.time():.3f}"]
    )
    sessions_ended.send(current_app._get_current_object(), user_id=user_id, session_ids=list(ended), whole_user=True)
    return int(version)


def list_sessions(user_id: str, current_session_id: str | None) -> list[dict]:
    """The user's live sessions, most recently used first (`S` in docs/api.md)."""
    client = get_redis()
    session_ids = sorted(client.smembers(Keys.user_sessions(user_id)))
    pipe = client.pipeline(transaction=False)
    for session_id in session_ids:
        pipe.hgetall(Keys.session(session_id))
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


def session_owner(session_id: str) -> str | None:
    """The user id a session belongs to, or None when it does not exist."""
    return get_redis().hget(Keys.session(session_id), "user_id")
