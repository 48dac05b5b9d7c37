"""The audit log: every security-relevant change, who made it, about whom and from where (API.md section 14).

Modules: `entries` says what an entry is (its type, actor, subject, address, id, the JSON log line) and
imports nothing of this package; `store` keeps entries in Redis and reads pages of them (it imports
`entries`); `views` serves `GET /admin/audit` and `GET /auth/activity` (it imports both, and is imported
by the app factory only, because it needs the guards, which need the auth package, which records entries).

Features record a change where it is made. One Lua script or MULTI on a user's keys records its entry
in that step (`new_entry`, then `script_keys`/`script_args` or `add_to_transaction`, then `complete`);
any other change calls `record` right after it succeeded.
"""

from __future__ import annotations

from flask import Flask

from .entries import CLI, SYSTEM, TYPES, Entry, configure_log, new_entry, user_actor
from .store import add_to_transaction, complete, record, script_args, script_keys

__all__ = [
    "CLI",
    "SYSTEM",
    "TYPES",
    "Entry",
    "add_to_transaction",
    "complete",
    "init_app",
    "new_entry",
    "record",
    "script_args",
    "script_keys",
    "user_actor",
]


def init_app(app: Flask) -> None:
    """Set up the `audit` logger that writes each entry's JSON line."""
    configure_log()
