"""`flask --app wsgi redis migrate-keys`: move a database from before the hash-tagged key names to them.

Key names gained hash tags so that each atomic step touches one hash slot of a Redis Cluster (see
`Keys`). A database written before that keeps its users, recovery codes, OAuth links, received webhooks
and queued mail under the old names; this renames them, on the one Redis they were written to (move to
a cluster afterwards). Sessions, refresh tokens and pending mailed or MFA tokens cannot move (the old
tokens do not name their user), so they are deleted: everyone logs in again. Last, every user is added
to the e-mail search index (which the users from before it lack). Safe to run twice.
"""

from __future__ import annotations

import re

import redis

from .auth.indexes import build_email_order
from .redis import Keys

OLD_USER = re.compile(r"user:([0-9a-f]{32})")
OLD_USER_PART = re.compile(r"user:([0-9a-f]{32}):(.+)")
OLD_WEBHOOK = re.compile(r"webhook:([a-z0-9_-]+):(delivery|seen):(.+)")
OLD_WEBHOOK_LOG = re.compile(r"webhook:([a-z0-9_-]+):log")
OLD_MAIL_JOB = re.compile(r"mail:job:(.+)")
DROPPED_PREFIXES = ("session:", "refresh:", "mailtoken:", "mfa:")


def migrate(client: redis.Redis) -> dict[str, int]:
    """Rename the old keys and fill the e-mail search index; returns how many keys were moved, dropped and
    users indexed."""
    counts = {"moved": 0, "dropped": 0, "indexed": 0}

    def move(old: str, new: str) -> None:
        if client.renamenx(old, new):
            counts["moved"] += 1
        else:  # already there (a second run, or written since): keep the newer one
            client.delete(old)
            counts["dropped"] += 1

    def drop(key: str) -> None:
        counts["dropped"] += client.delete(key)

    for key in list(client.scan_iter(count=1000)):
        if match := OLD_USER.fullmatch(key):
            user_id = match.group(1)
            move(key, Keys.user(user_id))
            created_at = client.hget(Keys.user(user_id), "created_at")
            if created_at is not None:
                client.zadd(Keys.users(), {user_id: float(created_at)}, nx=True)
        elif match := OLD_USER_PART.fullmatch(key):
            user_id, part = match.groups()
            if part == "recovery":
                move(key, Keys.user_recovery_codes(user_id))
            elif not key.startswith(("user:email:", "user:identity:")):
                drop(key)  # sessions, leases, mailed-token pointers, cool-downs
        elif key.startswith("user:identity:"):
            user_id = client.get(key)
            if user_id:
                client.sadd(Keys.user_identities(user_id), key)
        elif key.startswith(DROPPED_PREFIXES) or key == "users:indexed":
            drop(key)
        elif match := OLD_WEBHOOK.fullmatch(key):
            provider, kind, rest = match.groups()
            renamed = Keys.webhook_delivery if kind == "delivery" else Keys.webhook_seen
            move(key, renamed(provider, rest))
        elif match := OLD_WEBHOOK_LOG.fullmatch(key):
            move(key, Keys.webhook_log(match.group(1)))
        elif key == "webhook:pending":
            for member, score in client.zrange(key, 0, -1, withscores=True):
                client.zadd(Keys.webhook_pending(member.partition("\n")[0]), {member: score}, nx=True)
            drop(key)
        elif match := OLD_MAIL_JOB.fullmatch(key):
            move(key, Keys.mail_job(match.group(1)))
        elif key == "mail:queue":
            for member, score in client.zrange(key, 0, -1, withscores=True):
                client.zadd(Keys.mail_queue(), {member: score}, nx=True)
            drop(key)
    counts["indexed"] = build_email_order(client)
    return counts
