"""Namespaces, grants and presence (docs/api.md, Channels): managed by admins and `channels:manage` keys."""

from __future__ import annotations

import functools

from flask import Blueprint, current_app, jsonify

from ..auth.guards import current_api_key, current_caller, login_required, user_or_api_key
from ..errors import forbidden, not_found
from ..http import validated
from ..openapi import operation
from ..redis import get_redis
from . import grants, manage, namespaces, proxy
from .access import current_access
from .schemas import (
    ChannelPath,
    Channels,
    GrantRequest,
    MemberPath,
    Members,
    NamespacePath,
    NamespaceRules,
    Namespaces,
    Presence,
    PutNamespaceAnswer,
)

bp = Blueprint("channels", __name__)

SCOPE = "channels:manage"
MANAGERS = ("bearer", "cookie", "api_key")
USERS = ("bearer", "cookie")


def _is_manager() -> bool:
    return current_api_key() is not None or current_caller().is_admin


def managers_only(view):
    """Decorate a view for administrators and API keys with scope channels:manage (403 for others)."""

    @functools.wraps(view)
    @user_or_api_key(SCOPE)
    def wrapper(*args, **kwargs):
        if not _is_manager():
            raise forbidden(f"Only administrators (or API keys with scope {SCOPE}) may manage channels.")
        return view(*args, **kwargs)

    return wrapper


@bp.put("/admin/namespaces/<ns>")
@operation(
    "Create or replace a namespace (its channels' open subscriptions are checked again)",
    tags=["channels"],
    path=NamespacePath,
    body=NamespaceRules,
    responses={200: PutNamespaceAnswer},
    auth=MANAGERS,
)
@managers_only
def put_namespace(ns: str):
    """Create a namespace or replace its rules; 422 for a bad or reserved name, or a proxy_url refused.
    A proxy namespace's signing secret is answered by the PUT that makes it, never again."""
    rules = validated(NamespaceRules).model_dump()
    rotate = rules.pop("rotate_proxy_secret")
    return jsonify(proxy.define(namespaces.Namespace(ns, **rules, rotate_secret=rotate)))


@bp.get("/admin/namespaces")
@operation("Every namespace", tags=["channels"], responses={200: Namespaces}, auth=MANAGERS)
@managers_only
def list_namespaces():
    """Every namespace, by name."""
    return jsonify({"namespaces": [n.answer() for n in namespaces.list_namespaces(get_redis())]})


@bp.delete("/admin/namespaces/<ns>")
@operation(
    "Delete a namespace: its channels' open subscriptions end",
    tags=["channels"],
    path=NamespacePath,
    responses={204: None},
    auth=MANAGERS,
)
@managers_only
def delete_namespace(ns: str):
    """Delete a namespace; every open subscription to its channels ends as if revoked."""
    manage.remove_namespace(ns)
    return "", 204


@bp.put("/channels/<channel>/members/<user_id>")
@operation(
    "Grant a user a channel (again: new info and expiry)",
    tags=["channels"],
    path=MemberPath,
    body=GrantRequest,
    body_required=False,
    responses={204: None},
    auth=MANAGERS,
)
@managers_only
def grant(channel: str, user_id: str):
    """Grant one user one channel, with optional info (shown in presence) and expiry."""
    asked = validated(GrantRequest, optional=True)
    manage.grant_member(channel, user_id, asked.info, asked.expires_in)
    return "", 204


@bp.delete("/channels/<channel>/members/<user_id>")
@operation(
    "Revoke a user's grant of a channel (also 204 without one); it applies at once",
    tags=["channels"],
    path=MemberPath,
    responses={204: None},
    auth=MANAGERS,
)
@managers_only
def revoke(channel: str, user_id: str):
    """Revoke a grant: the user's open subscriptions to the channel end."""
    manage.revoke_member(channel, user_id)
    return "", 204


@bp.get("/channels/<channel>/members")
@operation("A channel's grants in force", tags=["channels"], path=ChannelPath, responses={200: Members}, auth=MANAGERS)
@managers_only
def list_members(channel: str):
    """The users granted the channel now, by user id."""
    manage.namespace_of(channel)
    return jsonify({"members": grants.members(get_redis(), channel)})


@bp.get("/channels")
@operation("The channels granted to the caller", tags=["channels"], responses={200: Channels}, auth=USERS)
@login_required
def my_channels():
    """The caller's grants in force, in namespaces that exist."""
    client = get_redis()
    granted = grants.channels_of(client, current_caller().user_id)
    existing = namespaces.get_namespaces(client, {namespaces.split_channel(c)[0] for c in granted})
    return jsonify({"channels": [c for c in granted if existing[namespaces.split_channel(c)[0]] is not None]})


@bp.get("/channels/<channel>/presence")
@operation(
    "Who reads a channel now (users: a channel they may read, of a namespace with presence)",
    tags=["channels"],
    path=ChannelPath,
    responses={200: Presence},
    auth=MANAGERS,
)
@user_or_api_key(SCOPE)
def presence(channel: str):
    """Up to 1,000 present users by user id, their grant's info and connection count; `count`: all."""
    namespace = manage.namespace_of(channel)
    if not _is_manager():
        if not namespace.presence:
            raise not_found(f"The namespace {namespace.name!r} keeps no presence.")
        caller = current_caller()
        if not current_access(get_redis(), caller.user_id, False, [channel])[channel].allowed:
            raise forbidden(f"You may not subscribe to {channel!r}.")
    return jsonify(current_app.extensions["presence"].snapshot(channel))
