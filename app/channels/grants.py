"""Grants: which users may read a channel of a `members` namespace, until when, with what info.

The channel's members hash (`members:{C}`, in its stream's hash slot) is the authority; the user's index
(`user:{U}:grants`, in the user record's slot) lists their channels for `GET /channels` and for purging
when the account is deleted. Writes go in an order that keeps every member of a channel in its user's
index, whatever interleaves: a grant writes the members hash, then the index; a revocation the index,
then the members hash. The index may hold a channel for a while that the members hash no longer does,
so readers of the index check each channel against the members hash.

A grant starts where the channel's stream stood when it was made (`start`, a stream id): its member reads
what is published from then on, not what was said before, nor while it was excluded. A grant made again
while in force keeps its start. Grants stored before starts were kept have none: their members read all
kept history, as they did.

A grant may name its `source`: `issuer:<name>` for the channels a trusted issuer's token lists. A grant
with a source is made, renewed and revoked only by that source, and never over a grant in force from
elsewhere: a grant made through the API (no source) stays as it is whatever a token lists. A grant made
through the API over one with a source replaces it (the source goes), keeping its start.
"""

from __future__ import annotations

import json
import time

from ..errors import validation_failed
from ..http import rfc3339
from ..redis import Keys

INFO_LIMIT = 1024  # bytes of compact JSON
EXPIRES_IN_LIMIT = 10 * 366 * 24 * 3600  # seconds: a longer grant is one without `expires_in`

# KEYS[1] the user's record, KEYS[2] the user's grants index. ARGV: channel, expiry ('' for none).
# Indexes the grant while the user exists: 1, or 0 when the account is gone (or being deleted).
INDEX_GRANT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""


# KEYS[1] the channel's members hash, KEYS[2] its stream (the same hash slot). ARGV: user id, now (epoch
# seconds), the grant's JSON without its closing brace, its source ('' for none). Stores the grant with its
# start, in one step with reading where the stream stands: the start of the user's grant if one is in force
# (granting again keeps it), else the stream's last id (0-0 when it has none). With a source, a grant in
# force from elsewhere (another source, or none) is kept as it is and nothing is written.
# Returns {outcome, start}: outcome `new` (no grant was in force), `again` (one was: its start kept) or
# `kept` (one from elsewhere is in force: not replaced).
GRANT_LUA = """
local start
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held then
  local ok, grant = pcall(cjson.decode, held)
  if ok and type(grant) == 'table' then
    local expires = grant['expires_at']
    if type(expires) ~= 'number' or expires > tonumber(ARGV[2]) then
      local source = type(grant['source']) == 'string' and grant['source'] or ''
      if ARGV[4] ~= '' and source ~= ARGV[4] then return {'kept', ''} end
      start = type(grant['start']) == 'string' and grant['start'] or '0-0'
    end
  end
end
local outcome = start and 'again' or 'new'
if not start then
  start = '0-0'
  if redis.call('EXISTS', KEYS[2]) == 1 then
    local info = redis.call('XINFO', 'STREAM', KEYS[2])
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then start = info[i + 1] end
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3] .. ',"start":"' .. start .. '"}')
return {outcome, start}
"""

# KEYS[1] the channel's members hash. ARGV: user id, source. Deletes the user's grant only while it is
# that source's: 1 when deleted, 0 otherwise.
REVOKE_SOURCED_LUA = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
local ok, grant = pcall(cjson.decode, held)
if not ok or type(grant) ~= 'table' or grant['source'] ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""
NO_START = "0-0"  # a grant's start before anything was published: its member reads all of the channel


def compact(value) -> str:
    """JSON as stored and measured: no spaces, non-ASCII kept as it is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_grant(info: dict | None, expires_in: float | None) -> None:
    """422 unless `info` is an object of at most 1 KiB as compact JSON and `expires_in` is in range."""
    if info is not None and (not isinstance(info, dict) or len(compact(info).encode()) > INFO_LIMIT):
        raise validation_failed(f"info must be a JSON object of at most {INFO_LIMIT} bytes as compact JSON.")
    if expires_in is not None and not 0 < expires_in <= EXPIRES_IN_LIMIT:
        raise validation_failed(f"expires_in must be more than 0 and at most {EXPIRES_IN_LIMIT} seconds.")


def live_grant(stored: str | None, now: float) -> dict | None:
    """A members-hash entry {"info", "expires_at", "start"?} while it is in force, else None."""
    grant = json.loads(stored) if stored else None
    if grant is None or (grant["expires_at"] is not None and grant["expires_at"] <= now):
        return None
    return grant


def grant(client, channel: str, user_id: str, info: dict | None, expires_in: float | None) -> bool:
    """Grant (or grant again, replacing info and expiry, keeping the start of a grant in force) one user one
    channel; False, with nothing kept, when the user does not exist."""
    check_grant(info, expires_in)
    now = time.time()
    expires_at = round(now + expires_in, 3) if expires_in is not None else None
    return _grant(client, channel, user_id, info, expires_at, None, now) != "gone"


def grant_from_source(client, channel: str, user_id: str, info: dict | None, expires_at: float, source: str) -> str:
    """Grant one user one channel on a source's word until `expires_at` (epoch seconds): `new`, `again` (a
    grant of that source was in force: its start kept), `kept` (a grant from elsewhere is in force: nothing
    written) or `gone` (no such user: nothing kept)."""
    if info is not None and len(compact(info).encode()) > INFO_LIMIT:
        info = None
    now = time.time()
    return _grant(client, channel, user_id, info, round(min(expires_at, now + EXPIRES_IN_LIMIT), 3), source, now)


def _grant(client, channel, user_id, info, expires_at, source, now) -> str:
    members = Keys.channel_members(channel)
    grant = {"info": info, "expires_at": expires_at, **({"source": source} if source else {})}
    head = compact(grant)[:-1]  # the script adds the start
    outcome, _ = client.register_script(GRANT_LUA)(
        keys=[members, Keys.stream(channel)], args=[user_id, repr(now), head, source or ""]
    )
    if outcome == "kept":
        return outcome
    index = client.register_script(INDEX_GRANT_LUA)
    expiry = f"{expires_at:.3f}" if expires_at is not None else ""
    if index(keys=[Keys.user(user_id), Keys.user_grants(user_id)], args=[channel, expiry]):
        return outcome
    client.hdel(members, user_id)  # the account is gone: forget_user may already have run
    return "gone"


def grant_start(grant: dict) -> str | None:
    """Where a grant in force starts its member's reading (a stream id), None for all kept history."""
    start = grant.get("start")
    return None if start in (None, NO_START) else start


def revoke(client, channel: str, user_id: str) -> bool:
    """Take a user's grant of a channel away; False if there was none (expired ones count as some)."""
    client.hdel(Keys.user_grants(user_id), channel)
    return client.hdel(Keys.channel_members(channel), user_id) == 1


def revoke_from_source(client, channel: str, user_id: str, source: str) -> bool:
    """Take a user's grant of a channel away only while it is `source`'s; False when it was not (none, or
    one made or replaced elsewhere)."""
    if not client.register_script(REVOKE_SOURCED_LUA)(keys=[Keys.channel_members(channel)], args=[user_id, source]):
        return False
    client.hdel(Keys.user_grants(user_id), channel)
    # A grant made elsewhere between the two steps keeps its entry in the user's index.
    stored = client.hget(Keys.channel_members(channel), user_id)
    if stored is not None:
        expires_at = json.loads(stored)["expires_at"]
        expiry = f"{expires_at:.3f}" if expires_at is not None else ""
        client.register_script(INDEX_GRANT_LUA)(
            keys=[Keys.user(user_id), Keys.user_grants(user_id)], args=[channel, expiry]
        )
    return True


def channels_from_source(client, user_id: str, source: str) -> list[str]:
    """The user's channels whose stored grant (in force or expired) is `source`'s, sorted."""
    channels = sorted(client.hkeys(Keys.user_grants(user_id)))
    if not channels:
        return []
    pipe = client.pipeline(transaction=False)  # one key each: fine across hash slots
    for channel in channels:
        pipe.hget(Keys.channel_members(channel), user_id)
    held = zip(channels, pipe.execute(), strict=True)
    return [channel for channel, stored in held if stored and json.loads(stored).get("source") == source]


def members(client, channel: str) -> list[dict]:
    """The channel's members in force, by user id: {"user_id", "info", "expires_at" (RFC 3339 or None)}."""
    now = time.time()
    found = []
    for user_id, stored in sorted(client.hgetall(Keys.channel_members(channel)).items()):
        member = live_grant(stored, now)
        if member is not None:
            found.append({"user_id": user_id, "info": member["info"], "expires_at": rfc3339(member["expires_at"])})
    return found


def channels_of(client, user_id: str) -> list[str]:
    """The channels the user is granted now (the index, checked against each members hash), sorted."""
    channels = sorted(client.hkeys(Keys.user_grants(user_id)))
    if not channels:
        return []
    pipe = client.pipeline(transaction=False)  # one key each: fine across hash slots
    for channel in channels:
        pipe.hget(Keys.channel_members(channel), user_id)
    now = time.time()
    return [channel for channel, stored in zip(channels, pipe.execute(), strict=True) if live_grant(stored, now)]


def forget_user(client, user_id: str) -> None:
    """Remove every grant of a deleted user (after the record is gone, so no grant can be indexed again)."""
    channels = client.hkeys(Keys.user_grants(user_id))
    pipe = client.pipeline(transaction=False)
    for channel in channels:
        pipe.hdel(Keys.channel_members(channel), user_id)
    pipe.delete(Keys.user_grants(user_id))
    pipe.execute()
