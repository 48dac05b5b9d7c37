"""Where audit entries are kept: the log and its indexes in Redis, written once per entry, read newest first.

Every entry is in `audit` (the whole log) and, when it has one, in its subject's index, both as members
"<id> <entry JSON>"; the indexes of its actor and of its type hold its id alone, and a page read from
them looks its entries up in the log (one more round trip, to one node), which keeps an entry's bulk
stored twice, not four times (`Keys.audit_*`). Each is a sorted set scored 0 throughout, so Redis orders
it by member, that is by id, that is by time: a page is one ZRANGE BYLEX REV below the cursor, and an
entry written late (another instance, a slower request) still lands in its place, with the same id in
every index. Each write also trims what is older than AUDIT_RETENTION_DAYS and renews the index's
lifetime to that, so an index nobody writes any more expires with its last entry; reads never return
what is older, trimmed yet or not.

A change made by one script or transaction on a user's keys records its entry in the subject's index in
that same step (`script_keys`, `script_args`, `add_to_transaction`): the change never lands without it.
The other indexes are in other hash slots, so `complete` writes them as the next step, with the log line,
before the request is answered. Other changes are recorded by `record`, right after they succeed.
"""

from __future__ import annotations

import logging
import time

import redis
from flask import current_app

from ..redis import Keys, describe_redis, get_redis, redis_error
from .entries import WITHOUT_ID, Entry, from_member, new_entry, write_log_line

log = logging.getLogger(__name__)

DAY_MS = 24 * 3600 * 1000
SCAN_LIMIT = 5000  # entries one filtered page reads at most before it answers with what it found
FILTERED_CHUNK = 500


def retention_ms() -> int:
    """How long entries are kept, in milliseconds (AUDIT_RETENTION_DAYS)."""
    return max(1, round(current_app.config["SETTINGS"].audit_retention_days * DAY_MS))


def oldest_kept(now_ms: int | None = None) -> str:
    """The smallest id prefix still kept: entries before it are past the retention."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{max(0, now_ms - retention_ms()):013d}"


def actor_key(actor: dict) -> str:
    """The index of an actor: by id, or `cli` and `system`, which have none."""
    return Keys.audit_actor(actor["id"] if actor["id"] is not None else actor["kind"])


def _indexes(entry: Entry) -> list[str]:
    """Every key the entry is kept in: the log, its actor's and type's index, its subject's (if any)."""
    keys = [Keys.audit_log(), actor_key(entry.actor), Keys.audit_type(entry.type)]
    return keys + ([Keys.audit_subject(entry.subject)] if entry.subject is not None else [])


def _holds_ids_only(key: str) -> bool:
    """Whether an index keeps ids alone (actors' and types'), whose entries are in the log."""
    return key.startswith(Keys.audit_actor("")) or key.startswith(Keys.audit_type(""))


def _add(pipe, key: str, member: str, oldest: str, ttl_ms: int) -> None:
    pipe.zadd(key, {member: 0})
    pipe.zremrangebylex(key, "-", "(" + oldest)
    pipe.pexpire(key, ttl_ms)


def script_keys(entry: Entry) -> list[str]:
    """The KEYS a script that records `entry` with AUDIT_LUA's record_audit() appends last."""
    return [Keys.audit_subject(entry.subject)]


def script_args(entry: Entry) -> list:
    """The ARGV a script that records `entry` with AUDIT_LUA's record_audit() appends last."""
    return [entry.member(), oldest_kept(), retention_ms()]


def add_to_transaction(pipe, entry: Entry) -> None:
    """Queue the entry's write to its subject's index in a MULTI on the subject's keys (one hash slot)."""
    _add(pipe, Keys.audit_subject(entry.subject), entry.member(), oldest_kept(), retention_ms())


def complete(entry: Entry) -> Entry:
    """After the step that wrote the entry to its subject's index: the other indexes and the log line."""
    return _store(entry, [key for key in _indexes(entry) if key != Keys.audit_subject(entry.subject)])


def record(entry_type: str, **fields) -> Entry:
    """Record an entry of a change that has just succeeded (see `new_entry` for the fields)."""
    entry = new_entry(entry_type, **fields)
    return _store(entry, _indexes(entry))


def _store(entry: Entry, keys: list[str]) -> Entry:
    """The log line first (it cannot fail), then one round trip per Redis node for the indexes.

    The change is made already: a Redis failure here is logged, not answered, so that a client does not
    try again a change that happened. The entry is still in the log line (and, for an entry written with
    its change, in its subject's index).
    """
    write_log_line(entry)
    member, oldest, ttl_ms = entry.member(), oldest_kept(), retention_ms()
    try:
        pipe = get_redis().pipeline(transaction=False)
        for key in keys:
            _add(pipe, key, entry.id if _holds_ids_only(key) else member, oldest, ttl_ms)
        pipe.execute()
    except redis.exceptions.RedisError as error:
        log.error(
            "audit entry %s (%s) not stored in %s: redis at %s failed (%s)",
            entry.id,
            entry.type,
            ", ".join(keys),
            describe_redis(current_app.config["SETTINGS"].redis_url),
            redis_error(error),
        )
    return entry


def _matches(entry: dict, subject: str | None, entry_type: str | None, actor: str | None) -> bool:
    if subject is not None and entry.get("subject") != subject:
        return False
    if entry_type is not None and entry["type"] != entry_type:
        return False
    if actor is None:
        return True
    kind, actor_id = entry["actor"]["kind"], entry["actor"]["id"]
    return actor_id == actor if actor not in WITHOUT_ID else (kind == actor and actor_id is None)


def read(
    *,
    subject: str | None = None,
    entry_type: str | None = None,
    actor: str | None = None,
    before: str | None = None,
    limit: int = 100,
) -> tuple[list[dict], str | None]:
    """A page of entries, newest first, older than `before`, matching every filter given; and the
    `before` of the next page, or None when nothing older matches.

    The narrowest index answers: the subject's, else the actor's, else the type's, else the whole log.
    With one filter that is all; with more, the others are checked entry by entry, reading at most
    SCAN_LIMIT entries, after which the page ends where the reading stopped (`next` is that point).
    """
    if subject is not None:
        key = Keys.audit_subject(subject)
    elif actor is not None:
        key = Keys.audit_actor(actor)
    elif entry_type is not None:
        key = Keys.audit_type(entry_type)
    else:
        key = Keys.audit_log()
    exact = sum(value is not None for value in (subject, entry_type, actor)) <= 1
    chunk = limit + 1 if exact else max(limit + 1, FILTERED_CHUNK)
    client = get_redis()
    upper, lower = ("(" + before) if before else "+", "[" + oldest_kept()
    found: list[dict] = []
    scanned = 0
    while True:
        members = client.zrange(key, upper, lower, desc=True, bylex=True, offset=0, num=chunk)
        entries = _looked_up(client, members) if _holds_ids_only(key) else map(from_member, members)
        for entry in entries:
            if entry is not None and _matches(entry, subject, entry_type, actor):
                found.append(entry)
                if len(found) > limit:
                    return found[:limit], found[limit - 1]["id"]
        scanned += len(members)
        if len(members) < chunk:
            return found, None
        upper = "(" + members[-1]
        if scanned >= SCAN_LIMIT:
            return found, members[-1].partition(" ")[0]


def _looked_up(client, entry_ids: list[str]) -> list[dict | None]:
    """The entries of these ids, from the log, in one round trip; None for one the log no longer has."""
    if not entry_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for entry_id in entry_ids:  # "<id> " <= its member < "<id>!": a space sorts just before "!"
        pipe.zrange(Keys.audit_log(), f"[{entry_id} ", f"({entry_id}!", bylex=True, offset=0, num=1)
    return [from_member(found[0]) if found else None for found in pipe.execute()]
