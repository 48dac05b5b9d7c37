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

from ..redis import Keys, get_redis, get_script, is_cluster

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


def claim_many(claims: list[tuple[str, str]]) -> list[str | None]:
    """Claim many index keys at once, each (key, user id) only while unset or already this user's: per
    claim None when claimed, else the value that holds it (see `claim` for what a held value means)."""
    answers = _script_batch(CLAIM_LUA, [([key], [PENDING + user_id, ""]) for key, user_id in claims])
    return [None if holder(value) == user_id else value for (_, user_id), value in zip(claims, answers, strict=True)]


def commit_many(claims: list[tuple[str, str]]) -> list[bool]:
    """`commit` for many (key, user id) at once."""
    answers = _script_batch(COMMIT_LUA, [([key], [PENDING + user_id, user_id]) for key, user_id in claims])
    return [bool(answer) for answer in answers]


def release_many(claims: list[tuple[str, str]]) -> None:
    """`release` for many (key, user id) at once."""
    _script_batch(RELEASE_LUA, [([key], [PENDING + user_id, user_id]) for key, user_id in claims])


def _script_batch(source: str, calls: list[tuple[list[str], list]]) -> list:
    """One script for many calls, pipelined: one pipeline on one Redis, one per node on a cluster (where the
    node's own pipeline loads the script if it lacks it)."""
    client, script = get_redis(), get_script(source)
    cluster = is_cluster(client)
    groups: dict[str, tuple] = {}
    for position, (keys, _) in enumerate(calls):
        node = client.get_node_from_key(keys[0]) if cluster else None
        groups.setdefault(node.name if node else "", (node, []))[1].append(position)
    results: list = [None] * len(calls)
    for node, positions in groups.values():
        pipe = (client.get_redis_connection(node) if node else client).pipeline(transaction=False)
        for position in positions:
            keys, args = calls[position]
            script(keys=keys, args=args, client=pipe)
        for position, answer in zip(positions, pipe.execute(), strict=True):
            results[position] = answer
    return results


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


# The e-mail search index: one sorted set, every score 0, so that it is ordered by member, bytewise. A member
# is `<stored e-mail>\x00<user id>` (a stored address is lower case and holds no control character), so
# that every address starting with a prefix is one ZRANGEBYLEX range, in ascending e-mail order. One key,
# one hash slot: it works on a Redis Cluster as on one Redis. A creation adds its member before the record
# is written and a deletion removes it after the record is gone, so a crash leaves at worst a member whose
# record is missing, which readers skip (and remove once no creation can still finish it). External users
# are never in it. EMAIL_ORDER_BUILT is set once the members of the users from before the index exist.
EMAIL_ORDER = "users:by-email"
EMAIL_ORDER_BUILT = "users:by-email:built"
EMAIL_ORDER_BUILDING = "users:by-email:building"  # held by the one search filling it (see users.py)
BUILD_GUARD_SECONDS = 60
_SEPARATOR = "\x00"
_BUILD_BATCH = 500


def email_order_member(email: str, user_id: str) -> str:
    """The e-mail search index's member for a user."""
    return f"{email}{_SEPARATOR}{user_id}"


def split_email_order_member(member: str) -> tuple[str, str]:
    """The e-mail and the user id of a member of the e-mail search index."""
    email, _, user_id = member.rpartition(_SEPARATOR)
    return email, user_id


def email_prefix_range(prefix: str) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of every member whose e-mail starts with `prefix` (0xff never occurs in UTF-8)."""
    raw = prefix.encode()
    return b"[" + raw, b"[" + raw + b"\xff"


def build_email_order(client, pause=lambda: None) -> int:
    """Add every e-mail-indexed user to the e-mail search index, then mark it built; how many were added.

    Safe at any time and to repeat (a member added for a user deleted meanwhile is stale, and skipped).
    `pause` runs between batches, to let other greenlets run.
    """
    added = 0
    batch: list[str] = []
    for user_id, _ in client.zscan_iter(Keys.users(), count=_BUILD_BATCH):
        batch.append(user_id)
        if len(batch) == _BUILD_BATCH:
            added += _index_emails_of(client, batch)
            batch = []
            pause()
    added += _index_emails_of(client, batch)
    client.set(EMAIL_ORDER_BUILT, "1")
    return added


def _index_emails_of(client, user_ids: list[str]) -> int:
    if not user_ids:
        return 0
    pipe = client.pipeline(transaction=False)
    for user_id in user_ids:
        pipe.hmget(Keys.user(user_id), ["email", "external_issuer"])
    members = {
        email_order_member(email, user_id): 0
        for user_id, (email, issuer) in zip(user_ids, pipe.execute(), strict=True)
        if email and not issuer  # no record (a crashed creation), or an external user: not indexed
    }
    return client.zadd(EMAIL_ORDER, members) if members else 0
