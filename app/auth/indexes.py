"""Global indexes to users (e-mail -> user id, OAuth identity -> user id), kept without multi-slot steps.

An index key and the user's record live in different hash slots of a Redis Cluster, so no one step can
write both. Creating a user is ordered instead, each step on one key: claim every index key
(`pending:<id>`), write the record, then commit each claim (`<id>`); on a conflict the claims are
released and the record deleted. A process that dies between the steps leaves at worst a claim whose
record is missing, and such a claim counts as free: the next claimant takes it over, with a
compare-and-set on the value it saw, so a creation that finishes meanwhile (its claim turns committed)
is never taken over. A pending claim whose record exists (its creator stopped just before committing)
is committed by whoever finds it.
"""

from __future__ import annotations

from ..redis import Keys, get_redis, get_script

PENDING = "pending:"
ATTEMPTS = 5

# KEYS[1] index. ARGV: the claimant's pending value (`pending:<id>`), the value the caller saw and found
# free ('' to claim only an unset index). nil when claimed, else the value that holds it.
CLAIM_LUA = """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[2] then return current end
redis.call('SET', KEYS[1], ARGV[1])
return false
"""

# KEYS[1] index. ARGV: the user's pending value, the user id. 1 when the index (pending or committed) is
# that user's and now committed.
COMMIT_LUA = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] and current ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""

# KEYS[1] index. ARGV: the user's pending value, the user id. Deletes the index only while it is that user's.
RELEASE_LUA = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] and current ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


def holder(value: str | None) -> str | None:
    """The user id an index value names, pending or committed."""
    return value.removeprefix(PENDING) if value else None


def claim(key: str, user_id: str) -> str | None:
    """Claim an index key for `user_id`: None when claimed, else the id of the live user holding it."""
    client = get_redis()
    script = get_script(CLAIM_LUA)
    seen = ""
    owner = None
    for _ in range(ATTEMPTS):
        value = script(keys=[key], args=[PENDING + user_id, seen])
        if value is None:
            return None
        owner = holder(value)
        if owner == user_id:
            return None
        if client.exists(Keys.user(owner)):
            if value != owner:
                commit(key, owner)  # its creator wrote the record but stopped before committing
            return owner
        seen = value  # the record is missing: free, unless it changes before we take it
    return owner


def commit(key: str, user_id: str) -> bool:
    """Make a claim final; False when it is no longer this user's (someone took over a stale claim)."""
    return bool(get_script(COMMIT_LUA)(keys=[key], args=[PENDING + user_id, user_id]))


def release(key: str, user_id: str) -> None:
    """Drop the index while it names `user_id` (a failed creation, a deleted user)."""
    get_script(RELEASE_LUA)(keys=[key], args=[PENDING + user_id, user_id])
