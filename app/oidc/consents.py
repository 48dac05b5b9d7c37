"""Consents: what a user let each client have, remembered per user and client as a set of scopes.

A request for scopes within the set needs no new consent; a request for more asks again, and allowing it adds
the new scopes to the set. The set is a field of the user's consents hash (the user's hash slot), changed in one
Lua step together with its audit entry. Withdrawing a consent also ends the client's sessions of that user: the
application loses what the user had let it have. A deleted client's consents are forgotten (see `forget_client`).
"""

from __future__ import annotations

import json
import time

from .. import audit
from ..auth import sessions
from ..http import rfc3339
from ..redis import AUDIT_LUA, Keys, get_redis, get_script
from .clients import OAuthClient, client_deleted, get_client

# KEYS[1] the user's consents hash, then the consent.granted entry's (AUDIT_LUA). ARGV: client id, now, the scopes
# allowed now, then the entry's (three). Adds the scopes to the client's set; answers the set as stored.
GRANT_LUA = (
    AUDIT_LUA
    + """
local stored, scopes, seen = redis.call('HGET', KEYS[1], ARGV[1]), {}, {}
if stored then
  for _, scope in ipairs(cjson.decode(stored)['scopes']) do
    if not seen[scope] then table.insert(scopes, scope); seen[scope] = true end
  end
end
for i = 3, #ARGV - 3 do
  if not seen[ARGV[i]] then table.insert(scopes, ARGV[i]); seen[ARGV[i]] = true end
end
table.sort(scopes)
local record = cjson.encode({scopes = scopes, granted_at = tonumber(ARGV[2])})
if #scopes == 0 then record = '{"scopes":[],"granted_at":' .. ARGV[2] .. '}' end
redis.call('HSET', KEYS[1], ARGV[1], record)
record_audit()
return record
"""
)


# KEYS[1] the user's consents hash, then the consent.withdrawn entry's (AUDIT_LUA). ARGV: client id, then the
# entry's. 1 when there was a consent (now gone, and recorded), else 0.
WITHDRAW_LUA = (
    AUDIT_LUA
    + """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
record_audit()
return 1
"""
)


def consented_scopes(user_id: str, client_id: str) -> set[str] | None:
    """The scopes the user let the client have; None when the user never allowed it anything (or withdrew)."""
    stored = get_redis().hget(Keys.user_consents(user_id), client_id)
    return set(json.loads(stored)["scopes"]) if stored else None


def covers(user_id: str, client_id: str, scopes: list[str]) -> bool:
    """Whether the user has allowed this client already, every one of `scopes` included (a request for no scope at
    all still needs the user to have allowed the client: it would learn who signed in)."""
    allowed = consented_scopes(user_id, client_id)
    return allowed is not None and set(scopes) <= allowed


def grant(user_id: str, client: OAuthClient, scopes: list[str]) -> None:
    """The user allows the client these scopes (added to what it had), recorded as consent.granted."""
    get_redis().sadd(Keys.client_users(client.client_id), user_id)  # before: deleting the client finds the consent
    entry = audit.new_entry(
        "consent.granted", subject=user_id, details={"client_id": client.client_id, "scopes": sorted(set(scopes))}
    )
    get_script(GRANT_LUA)(
        keys=[Keys.user_consents(user_id), *audit.script_keys(entry)],
        args=[client.client_id, f"{time.time():.3f}", *sorted(set(scopes)), *audit.script_args(entry)],
    )
    audit.complete(entry)


def _answer(client: OAuthClient, stored: str) -> dict:
    record = json.loads(stored)
    return {
        "client_id": client.client_id,
        "name": client.name,
        "scopes": record["scopes"],
        "granted_at": rfc3339(record["granted_at"]),
    }


def list_consents(user_id: str) -> list[dict]:
    """The user's consents, newest first, each with its client's name (those of deleted clients are forgotten)."""
    stored = get_redis().hgetall(Keys.user_consents(user_id))
    found, gone = [], []
    for client_id, record in stored.items():
        client = get_client(client_id)
        if client is None:
            gone.append(client_id)
        else:
            found.append(_answer(client, record))
    if gone:
        get_redis().hdel(Keys.user_consents(user_id), *gone)
    return sorted(found, key=lambda consent: consent["granted_at"], reverse=True)


def get_consent(user_id: str, client_id: str) -> dict | None:
    """The user's consent to one client, or None."""
    client = get_client(client_id)
    stored = get_redis().hget(Keys.user_consents(user_id), client_id) if client is not None else None
    return _answer(client, stored) if stored else None


def withdraw(user_id: str, client_id: str) -> bool:
    """Withdraw the user's consent to a client, recorded as consent.withdrawn, and end the client's sessions of
    the user; False when there was none."""
    entry = audit.new_entry("consent.withdrawn", subject=user_id, details={"client_id": client_id})
    removed = get_script(WITHDRAW_LUA)(
        keys=[Keys.user_consents(user_id), *audit.script_keys(entry)], args=[client_id, *audit.script_args(entry)]
    )
    if not removed:
        return False
    audit.complete(entry)
    end_client_sessions(user_id, client_id)
    return True


def end_client_sessions(user_id: str, client_id: str) -> list[str]:
    """End every session of the user that belongs to this client; the ended ids."""
    owned = [sid for sid, owner in sessions.client_sessions(user_id).items() if owner == client_id]
    return [sid for sid in sorted(owned) if sessions.end_session(user_id, sid, "session.revoked")]


def forget_client(sender, client_id: str, **_) -> None:
    """A client was deleted: every session of it ends and every consent to it is forgotten."""
    client = get_redis()
    users = sorted(client.smembers(Keys.client_users(client_id)))
    for user_id in users:
        end_client_sessions(user_id, client_id)
        client.hdel(Keys.user_consents(user_id), client_id)
    client.delete(Keys.client_users(client_id))


def init_app(app) -> None:
    """Deleting a client ends what was issued to it."""
    client_deleted.connect(forget_client, sender=app, weak=False)
