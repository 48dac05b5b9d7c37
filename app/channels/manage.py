"""Changes to namespaces and grants as the API and the command line make them: checked, stored, announced.

Each change is announced on the event bus, so that every worker re-checks the open subscriptions it
concerns: a revoked grant or a deleted namespace ends them at once, a changed one is read again. Grants a
source makes (a trusted issuer's token listing channels) go the same way (`apply_source_grants`).
"""

from __future__ import annotations

from flask import current_app

from .. import audit
from ..auth.users import USER_ID, get_user
from ..errors import not_found
from ..http import rfc3339
from ..redis import get_redis
from . import grants, namespaces
from .namespaces import Namespace


def _announce(reason: str, **where) -> None:
    current_app.extensions["event_bus"].announce_access_changed(reason, **where)


def namespace_of(channel: str) -> Namespace:
    """The namespace of a named channel; 404 for a malformed name or a namespace that does not exist."""
    split = namespaces.split_channel(channel)
    namespace = namespaces.get_namespace(get_redis(), split[0]) if split else None
    if namespace is None:
        raise not_found(f"No channel {channel[:200]!r}: channels are <namespace>:<name> of an existing namespace.")
    return namespace


def define_namespace(namespace: Namespace) -> Namespace:
    """Create or replace a namespace (422 for a bad or reserved name, or bad rules)."""
    client = get_redis()
    before = namespaces.get_namespace(client, namespace.name)
    namespaces.put_namespace(client, namespace)
    rules = {name: value for name, value in namespace.as_json().items() if name != "name"}
    audit.record("namespace.put", details={"namespace": namespace.name, **rules, "created": before is None})
    if before is not None and before != namespace:
        _announce("access_changed", namespace=namespace.name)
    return namespace


def remove_namespace(name: str) -> None:
    """Delete a namespace (404 if there is none); its channels' open subscriptions end."""
    if not namespaces.delete_namespace(get_redis(), name):
        raise not_found(f"No namespace {name[:100]!r}.")
    audit.record("namespace.deleted", details={"namespace": name})
    _announce("namespace_deleted", namespace=name)


def grant_member(channel: str, user_id: str, info: dict | None, expires_in: float | None) -> None:
    """Grant a user a channel (404 for an unknown channel or user, 422 for bad info or expiry)."""
    namespace_of(channel)
    grants.check_grant(info, expires_in)
    if not USER_ID.fullmatch(user_id) or get_user(user_id) is None:
        raise not_found("No such user.")
    if not grants.grant(get_redis(), channel, user_id, info, expires_in):
        raise not_found("No such user.")
    # Not its info: whatever an application keeps there is its own business.
    audit.record("channel.member_added", subject=user_id, details={"channel": channel, "expires_in": expires_in})
    _announce("access_changed", channel=channel, user_id=user_id)


def revoke_member(channel: str, user_id: str) -> None:
    """Take a user's grant of a channel away, also when there is none (404 for an unknown channel, or
    a user id of the wrong shape)."""
    namespace_of(channel)
    if not USER_ID.fullmatch(user_id):
        raise not_found("No such user.")
    if grants.revoke(get_redis(), channel, user_id):
        audit.record("channel.member_removed", subject=user_id, details={"channel": channel})
    _announce("revoked", channel=channel, user_id=user_id)


def apply_source_grants(
    user_id: str, source: str, channels: list[str], info: dict | None, expires_at: float
) -> tuple[list[str], list[str]]:
    """Grant a user the channels a source names now, until `expires_at`, and revoke the ones that source
    granted before and no longer names; (granted, revoked).

    Names that are malformed or of no namespace are left out. A grant in force from elsewhere (the API, or
    another source) is neither replaced nor revoked. Every change is announced as the API's are, so open
    subscriptions learn a new expiry and lose a revoked channel within a second.
    """
    client = get_redis()
    named = {channel: split for channel in channels if (split := namespaces.split_channel(channel))}
    existing = namespaces.get_namespaces(client, {split[0] for split in named.values()})
    wanted = sorted(channel for channel, split in named.items() if existing[split[0]] is not None)
    granted = []
    for channel in wanted:
        outcome = grants.grant_from_source(client, channel, user_id, info, expires_at, source)
        if outcome == "gone":
            return granted, []  # the account was deleted meanwhile: nothing more to grant or revoke
        if outcome == "kept":
            continue
        if outcome == "new":  # a renewal (a later expiry) is announced, not recorded again
            details = {"channel": channel, "source": source, "expires_at": rfc3339(expires_at)}
            audit.record("channel.member_added", subject=user_id, actor=audit.SYSTEM, details=details)
        granted.append(channel)
        _announce("access_changed", channel=channel, user_id=user_id)
    revoked = []
    for channel in grants.channels_from_source(client, user_id, source):
        if channel in granted or not grants.revoke_from_source(client, channel, user_id, source):
            continue
        audit.record(
            "channel.member_removed",
            subject=user_id,
            actor=audit.SYSTEM,
            details={"channel": channel, "source": source},
        )
        revoked.append(channel)
        _announce("revoked", channel=channel, user_id=user_id)
    return granted, revoked
