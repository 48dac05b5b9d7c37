"""`GET /admin/audit` (administrators, and API keys with scope audit:read) and `GET /auth/activity` (a user's own)."""

from __future__ import annotations

from flask import Blueprint, jsonify

from ..auth.guards import current_api_key, current_caller, login_required, user_or_api_key
from ..errors import forbidden
from ..http import validated_query
from ..openapi import operation
from . import store
from .schemas import ActivityQuery, AuditPage, AuditQuery

bp = Blueprint("audit", __name__)

SCOPE = "audit:read"
READERS = ("bearer", "cookie", "api_key")
USER = ("bearer", "cookie")


@bp.get("/admin/audit")
@operation(
    "The audit log, newest first: every security-relevant change, by subject, type and actor",
    tags=["audit"],
    query=AuditQuery,
    responses={200: AuditPage},
    auth=READERS,
)
@user_or_api_key(SCOPE)
def audit_log():
    """A page of the audit log; `next` is the `before` of the page after it."""
    if current_api_key() is None and not current_caller().is_admin:
        raise forbidden(f"Only administrators (or API keys with scope {SCOPE}) may read the audit log.")
    query = validated_query(AuditQuery)
    entries, following = store.read(
        subject=query.subject, entry_type=query.type, actor=query.actor, before=query.before, limit=query.limit
    )
    return jsonify({"entries": entries, "next": following})


@bp.get("/auth/activity")
@operation(
    "The caller's own audit entries (those about them), newest first",
    tags=["audit"],
    query=ActivityQuery,
    responses={200: AuditPage},
    auth=USER,
)
@login_required
def activity():
    """The caller's logins, devices and security changes: the audit entries whose subject they are."""
    query = validated_query(ActivityQuery)
    user_id = current_caller().user_id
    entries, following = store.read(subject=user_id, before=query.before, limit=query.limit)
    return jsonify({"entries": [_as_seen_by(user_id, entry) for entry in entries], "next": following})


def _as_seen_by(user_id: str, entry: dict) -> dict:
    """An entry as its subject sees it: who else made a change (an administrator, a key, someone who tried
    the password) shows by kind only, without an id or an address."""
    if entry["actor"] == {"kind": "user", "id": user_id}:
        return entry
    seen = {**entry, "actor": {"kind": entry["actor"]["kind"], "id": None}}
    seen.pop("ip", None)
    return seen
