"""What an audit entry is (`A` in docs/api.md): its type, who made the change, about whom, from where.

An entry's id is `<13-digit epoch milliseconds>-<16 hex digits>`: ids order by time as text, so every
index of the log keeps them in a sorted set ordered by member, and one entry has the same id in each.
The milliseconds are the recording process's clock (`at` is read from them); the hex digits are a
counter of this process and random bits, so entries of one request keep their order within a
millisecond and two processes never make the same id.

Nothing secret goes into an entry: callers name users by id (never by e-mail), sessions, keys,
endpoints and passkeys by their ids, and say what changed, never to what secret value.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import click
from flask import current_app, g, has_app_context, has_request_context, request

from ..http import ip_address

#: Every type of entry the service records (API.md section 14).
TYPES = (
    "user.registered",
    "login.succeeded",
    "login.failed",
    "logout",
    "session.revoked",
    "refresh.reuse_detected",
    "password.changed",
    "password.reset",
    "email.verified",
    "mfa.enabled",
    "mfa.disabled",
    "mfa.reset",
    "passkey.added",
    "passkey.removed",
    "role.changed",
    "user.deleted",
    "users.exported",
    "api_key.created",
    "api_key.deleted",
    "webhook_endpoint.created",
    "webhook_endpoint.updated",
    "webhook_endpoint.deleted",
    "namespace.put",
    "namespace.deleted",
    "channel.member_added",
    "channel.member_removed",
    "issuer.put",
    "issuer.deleted",
    "oauth_client.created",
    "oauth_client.updated",
    "oauth_client.deleted",
    "signing_key.rotated",
    "signing_key.retired",
    "consent.granted",
    "consent.withdrawn",
    "org.created",
    "org.updated",
    "org.deleted",
    "org.member_added",
    "org.member_removed",
    "org.role_changed",
    "org.invitation_created",
    "org.invitation_revoked",
    "org.invitation_accepted",
)
ENTRY_ID_PATTERN = r"^[0-9]{13}-[0-9a-f]{16}$"
ENTRY_ID = re.compile(ENTRY_ID_PATTERN)
CLI = {"kind": "cli", "id": None}
SYSTEM = {"kind": "system", "id": None}
WITHOUT_ID = ("cli", "system")  # actors that are no one in particular

audit_log = logging.getLogger("audit")
_sequence = itertools.count()


@dataclass(frozen=True)
class Entry:
    """One audit entry, as recorded."""

    id: str
    type: str
    actor: dict
    subject: str | None = None
    ip: str | None = None
    details: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        """`A`: the entry as answers and the log line show it (`subject` and `ip` only when known)."""
        answer = {"id": self.id, "at": at(self.id), "type": self.type, "actor": dict(self.actor)}
        if self.subject is not None:
            answer["subject"] = self.subject
        if self.ip is not None:
            answer["ip"] = self.ip
        answer["details"] = dict(self.details)
        return answer

    def member(self) -> str:
        """How the entry is stored: its id, a space, and the rest as compact JSON (`at` is in the id)."""
        stored = self.as_json()
        del stored["id"], stored["at"]
        return f"{self.id} {json.dumps(stored, separators=(',', ':'))}"


def from_member(member: str) -> dict:
    """`A` from a stored member."""
    entry_id, _, stored = member.partition(" ")
    return {"id": entry_id, "at": at(entry_id), **json.loads(stored)}


def at(entry_id: str) -> str:
    """When the entry was recorded, as RFC 3339 in UTC with milliseconds."""
    moment = datetime.fromtimestamp(int(entry_id[:13]) / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_id(at_ms: int | None = None) -> str:
    """A fresh entry id for now (or for `at_ms`)."""
    ms = int(time.time() * 1000) if at_ms is None else at_ms
    return f"{ms:013d}-{next(_sequence) % 2**32:08x}{secrets.token_hex(4)}"


def user_actor(user_id: str) -> dict:
    """The actor that is a user (the one concerned, or an administrator)."""
    return {"kind": "user", "id": user_id}


def current_actor(subject: str | None = None) -> dict:
    """Who makes the change at hand: the CLI outside a request; else the API key or the signed-in user
    calling; else (a login, a registration, a link from a mail) the user concerned; else the system."""
    if not has_request_context():
        return dict(CLI)
    key = g.get("api_key")
    if key is not None:
        return {"kind": "api_key", "id": key.id}
    caller = g.get("caller")
    if caller is not None:
        return user_actor(caller.user_id)
    return user_actor(subject) if subject is not None else dict(SYSTEM)


def client_ip() -> str | None:
    """The client address of the request at hand (after the trusted-proxy rule), if there is a request."""
    if not has_request_context():
        return None
    address = ip_address(request.remote_addr)
    return str(address) if address is not None else None


def new_entry(
    entry_type: str,
    *,
    subject: str | None = None,
    details: dict | None = None,
    actor: dict | None = None,
    at_ms: int | None = None,
) -> Entry:
    """An entry of `entry_type` made now, its actor and address taken from the request (or the CLI)."""
    if entry_type not in TYPES:
        raise ValueError(f"unknown audit entry type {entry_type!r}")
    actor = dict(actor) if actor is not None else current_actor(subject)
    # Every change a request made or attempted has its client's address, a failed login's and a detected
    # refresh-token reuse's above all (who tried); only the CLI and the service's own work have none.
    ip = None if actor["kind"] == "cli" else client_ip()
    return Entry(new_id(at_ms), entry_type, actor, subject, ip, dict(details or {}))


def configure_log() -> None:
    """The `audit` logger: one JSON line per entry on stderr, whatever LOG_LEVEL says, beside the other
    logs (stdout stays the request log's, and the CLI's own output)."""
    if not audit_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        audit_log.addHandler(handler)
        audit_log.setLevel(logging.INFO)
        audit_log.propagate = False


CLI_LOG_NAME = "cli-audit.log"


def _a_command_at_a_terminal() -> bool:
    """A `flask` command whose stderr is someone's terminal, where it says what it did in words."""
    return click.get_current_context(silent=True) is not None and sys.stderr.isatty()


def _kept_beside_the_terminal(text: str) -> bool:
    """Append a terminal command's line to DATA_DIR/cli-audit.log (owner-only); False if it cannot be."""
    if not has_app_context():
        return False
    path = current_app.config["SETTINGS"].data_dir / CLI_LOG_NAME
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return False
    with os.fdopen(descriptor, "a") as log_file:
        log_file.write(text + "\n")
    return True


def write_log_line(entry: Entry) -> None:
    """The entry as one JSON log line: `A` with the fields every line has (`logger: "audit"`). A `flask` command
    at a terminal writes it to DATA_DIR/cli-audit.log instead of into the person's output."""
    line = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "level": "info",
        "logger": "audit",
        "msg": entry.type,
        **entry.as_json(),
    }
    text = json.dumps(line)
    if not (_a_command_at_a_terminal() and _kept_beside_the_terminal(text)):
        audit_log.info(text)
