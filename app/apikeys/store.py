"""API-key records: created once (only the SHA-256 is kept), checked in one round trip, deleted at once.

Every check reads Redis, so a deleted key stops working on every worker and instance with the next request,
and a check costs what an access-token check costs (one script). The quick publisher keeps the scopes and
channels of keys it has verified (a record never changes) and asks whether the record still exists in the
publication's own atomic step (`Bus.publish_while_key`).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from dataclasses import dataclass

from flask import current_app

from .. import audit
from ..channels.patterns import covers
from ..channels.patterns import refusal as channel_patterns_refusal
from ..errors import validation_failed
from ..http import plain_text, rfc3339
from ..redis import Keys, get_redis

KEY_PREFIX = "ak_"
SCOPES = (
    "events:publish",
    "tokens:introspect",
    "webhooks:manage",
    "channels:manage",
    "audit:read",
    "issuers:manage",
    "clients:manage",
    "orgs:manage",
)
NAME_LIMIT, CHANNELS_LIMIT = 100, 100
TOUCH_INTERVAL_SECONDS = 60  # last_used_at is written at most this often per key

# KEYS[1] the key's record. ARGV: now, touch interval. The record's fields, touching last_used_at at
# most once per interval, in the same round trip; nil for an unknown key.
VERIFY_API_KEY = """
local key = redis.call('HMGET', KEYS[1], 'id', 'name', 'scopes', 'channels', 'last_used_at')
if not key[1] then return nil end
if tonumber(ARGV[1]) - (tonumber(key[5]) or 0) >= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'last_used_at', ARGV[1])
end
return key
"""


@dataclass(frozen=True)
class ApiKey:
    """A verified API key: what it may do and where it may publish."""

    id: str
    name: str
    scopes: frozenset[str]
    channels: tuple[str, ...]

    def may_publish(self, channel: str) -> bool:
        """Exact channel names, `<ns>:*` for a namespace's channels (`user:*`: every user's), `*` for all."""
        return any(covers(allowed, channel) for allowed in self.channels)


def hash_key(raw: str) -> str:
    """The SHA-256 under which a key is stored (the key itself never is)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def validate_request(name, scopes, channels) -> tuple[str, list[str], list[str]]:
    """A key's name, scopes and channels as an admin asks for them, or 422 naming what is wrong."""
    name = plain_text(name.strip(), "The key's name")
    if not 1 <= len(name) <= NAME_LIMIT:
        raise validation_failed(f"The key's name must have 1 to {NAME_LIMIT} characters.")
    unknown = [scope for scope in scopes if scope not in SCOPES]
    if not scopes or unknown:
        raise validation_failed(f"Scopes must be one or more of {', '.join(SCOPES)}.")
    if len(channels) > CHANNELS_LIMIT:
        raise validation_failed(f"At most {CHANNELS_LIMIT} channels.")
    refused = channel_patterns_refusal(channels)
    if refused is not None:
        raise validation_failed(f"{refused[:1].upper()}{refused[1:]}.")
    if "events:publish" in scopes and not channels:
        raise validation_failed("A key with scope events:publish needs at least one channel.")
    return name, sorted(set(scopes)), sorted(set(channels))


def create_key(name: str, scopes: list[str], channels: list[str]) -> tuple[str, dict]:
    """A new key (shown to the caller this once) and its public record K."""
    name, scopes, channels = validate_request(name, scopes, channels)
    raw = KEY_PREFIX + secrets.token_urlsafe(32)  # 256 bits
    key_hash, key_id, now = hash_key(raw), uuid.uuid4().hex, f"{time.time():.3f}"
    record = {
        "id": key_id,
        "name": name,
        "scopes": json.dumps(scopes),
        "channels": json.dumps(channels),
        "created_at": now,
        "last_used_at": "",
    }
    # Three keys in three hash slots, written in an order that is safe to stop anywhere: the list and the
    # id's pointer first, the record (which makes the key work) last. Listing skips ids without a record.
    client = get_redis()
    client.sadd(Keys.api_keys(), key_id)
    client.set(Keys.api_key_hash(key_id), key_hash)
    client.hset(Keys.api_key(key_hash), mapping=record)
    details = {"api_key_id": key_id, "name": name, "scopes": scopes, "channels": channels}
    audit.record("api_key.created", details=details)
    return raw, public_key(record)


def verify_key(raw: str) -> ApiKey | None:
    """The key a caller presents, or None when it is unknown or deleted (one round trip)."""
    return key_of(verify_key_answer(raw))


def verify_key_answer(raw: str):
    """The verification script's answer for a key (`key_of` reads it)."""
    verify = current_app.extensions["verify_api_key"]
    return verify(keys=[Keys.api_key(hash_key(raw))], args=verification_args())


def verification_command(raw: str) -> tuple[str, tuple, dict]:
    """`verify_key` as a command to send with others in one pipeline (`key_of` reads its answer); it fails
    with NoScriptError before the script was loaded, which `verify_key` does."""
    sha = current_app.extensions["verify_api_key"].sha
    return "evalsha", (sha, 1, Keys.api_key(hash_key(raw)), *verification_args()), {}


def verification_args() -> list:
    """The script's ARGV: the time now, and how often last_used_at is written."""
    return [f"{time.time():.3f}", TOUCH_INTERVAL_SECONDS]


def key_of(found) -> ApiKey | None:
    """The key the verification script found, or None."""
    if not found:
        return None
    key_id, name, scopes, channels, _ = found
    return ApiKey(key_id, name, frozenset(json.loads(scopes)), tuple(json.loads(channels)))


def list_keys() -> list[dict]:
    """Every key's public record K, newest first (never the key itself)."""
    client = get_redis()
    key_ids = sorted(client.smembers(Keys.api_keys()))
    pipe = client.pipeline(transaction=False)  # one key each: fine across hash slots
    for key_id in key_ids:
        pipe.get(Keys.api_key_hash(key_id))
    hashes = pipe.execute() if key_ids else []
    for key_hash in hashes:
        pipe.hgetall(Keys.api_key(key_hash or "missing"))
    records = [record for record in (pipe.execute() if hashes else []) if record]
    return sorted((public_key(record) for record in records), key=lambda k: k["created_at"], reverse=True)


def delete_key(key_id: str) -> bool:
    """Delete a key; it stops working with the next request everywhere. False if there was none."""
    client = get_redis()
    key_hash = client.get(Keys.api_key_hash(key_id))
    if key_hash is None:
        return False
    # The record first: from then on the key is refused everywhere; the pointer and the list entry after.
    name = client.hget(Keys.api_key(key_hash), "name")
    client.delete(Keys.api_key(key_hash))
    client.delete(Keys.api_key_hash(key_id))
    client.srem(Keys.api_keys(), key_id)
    audit.record("api_key.deleted", details={"api_key_id": key_id, "name": name})
    return True


def public_key(record: dict) -> dict:
    """K: what listing and creation show of a key."""
    return {
        "id": record["id"],
        "name": record["name"],
        "scopes": json.loads(record["scopes"]),
        "channels": json.loads(record["channels"]),
        "created_at": rfc3339(record["created_at"]),
        "last_used_at": rfc3339(record.get("last_used_at")),
    }
