"""Who may subscribe to and publish on a channel: section-4 channels and the channels of namespaces.

`current_access` never raises an ApiError and never asks a subscribe proxy (open subscriptions re-check with
it); `check_subscribe` and `check_publish` answer a request with 400, 404 or 403 (`check_subscribe` asks the
subscribe proxy of a `proxy` namespace about a channel the user holds no grant of: 403 or 503); `recheck`
reads access again inside a reader's opening round trip, once its subscription is in force.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..auth.sessions import member_role
from ..errors import ApiError, bad_request, forbidden, not_found
from ..events.bus import BROADCAST, USER_CHANNEL_PREFIX, WEBHOOKS, user_channel
from ..redis import Keys, read_together
from .grants import grant_start, live_grant
from .namespaces import (
    RESERVED,
    Namespace,
    get_namespace,
    get_namespaces,
    namespaces_named,
    org_of_channel,
    parse_namespace,
    read_namespaces,
    split_channel,
)

NO_NAMESPACE = "namespace_deleted"


@dataclass(frozen=True)
class Access:
    """Whether a caller may read a channel now; why not; until when."""

    allowed: bool
    reason: str | None = None  # when not allowed: "namespace_deleted" | "revoked" | "expired" | "access_changed"
    expires_at: float | None = None  # epoch seconds when the caller's grant runs out (members namespaces)
    namespace: Namespace | None = None  # None for section-4 channels (user:<id>, broadcast)
    start: str | None = None  # a member's grant's start (a stream id): it reads from there on; None: all history


def _own_channel(channel: str) -> bool:
    """A channel of section 4 (and the admins' `webhooks`): its rules are not a namespace's."""
    return channel in (BROADCAST, WEBHOOKS) or (
        channel.startswith(USER_CHANNEL_PREFIX) and split_channel(channel) is not None
    )


def _read_default(channel: str, user_id: str, is_admin: bool) -> Access:
    allowed = is_admin or channel == BROADCAST or channel == user_channel(user_id)
    return Access(True) if allowed else Access(False, "access_changed")


def _read_named(namespace: Namespace | None, stored: str | None, is_admin: bool, now: float) -> Access:
    """Access to a channel of `namespace`; `stored` is what decides it for a user: the channel's grant of them
    (members, proxy) or their entry in the members of the organization the channel names (org namespaces)."""
    if namespace is None:
        return Access(False, NO_NAMESPACE)
    if is_admin or namespace.subscribe == "authenticated":
        return Access(True, namespace=namespace)
    if namespace.by_org:  # members of the organization read all kept history, as long as they are members
        allowed = namespace.admits_role(member_role(stored))
        return Access(True, namespace=namespace) if allowed else Access(False, "revoked", namespace=namespace)
    grant = live_grant(stored, now)
    if grant is None:
        return Access(False, "expired" if stored else "revoked", namespace=namespace)
    return Access(True, expires_at=grant["expires_at"], namespace=namespace, start=grant_start(grant))


def deciding_key(channel: str, namespace: Namespace | None) -> str | None:
    """The hash whose field of the user decides whether a user (not an admin) reads a channel of `namespace`: the
    channel's grants (members, proxy), the members of the organization it names (org namespaces); None when no
    entry of the user decides (authenticated, no namespace)."""
    if namespace is None:
        return None
    if namespace.by_grant:
        return Keys.channel_members(channel)
    if namespace.by_org:
        org_id = org_of_channel(split_channel(channel)[1])
        return Keys.org_members(org_id) if org_id else None
    return None


def current_access(
    client, user_id: str, is_admin: bool, channels: list[str], namespaces_read: dict | None = None
) -> dict[str, Access]:
    """What the user may read of `channels` now: one HMGET of namespaces and one pipelined HGET per channel
    whose namespace admits some users only (a grant for `members` and `proxy`, membership of the organization
    the channel names for `org_members` and `org_admins`). A malformed name counts as a namespace that is gone.
    `namespaces_read`: the namespaces' stored texts, read already by this request (`get_namespaces`)."""
    named = {channel: split_channel(channel) for channel in channels if not _own_channel(channel)}
    namespaces = get_namespaces(client, namespaces_named(named), namespaces_read)
    namespace_of = {channel: namespaces.get(split[0]) if split else None for channel, split in named.items()}
    deciding = {
        channel: key
        for channel, namespace in namespace_of.items()
        if not is_admin and (key := deciding_key(channel, namespace)) is not None
    }
    stored = {}
    if deciding:  # one key each: fine across hash slots
        answers = read_together(client, [("hget", (key, user_id), {}) for key in deciding.values()])
        stored = dict(zip(deciding, answers, strict=True))
    now = time.time()
    return {
        channel: (
            _read_default(channel, user_id, is_admin)
            if channel not in named
            else _read_named(namespace_of[channel], stored.get(channel), is_admin, now)
        )
        for channel in channels
    }


class Recheck(NamedTuple):
    """Access read again inside a reader's opening round trip: the commands to send, and the judge of their answers."""

    commands: list  # (name, args, kwargs) of plain Redis commands
    judge: Callable[[list], dict[str, Access]]  # their answers -> each channel's Access now


def recheck(client, user_id: str, is_admin: bool, checked: dict[str, Access]) -> Recheck:
    """Read again what decides the user's access to the channels of `checked` (each with the Access its check
    found): one HMGET of their namespaces, and one HGET of the grant (or the organization's membership) of each
    channel whose namespace admitted some users only. A namespace opened to `authenticated` users since is judged
    by its new rules; one closed to some users since (nothing of the user was read, or another entry decides
    now) is asked about in a round trip of its own (`current_access`)."""
    named = {channel: split_channel(channel) for channel in checked if not _own_channel(channel)}
    names = sorted(namespaces_named(named))
    read = {
        channel: key
        for channel, access in checked.items()
        if channel in named and not is_admin and (key := deciding_key(channel, access.namespace)) is not None
    }
    granted = list(read)
    commands = [read_namespaces(names)] if names else []
    commands += [("hget", (key, user_id), {}) for key in read.values()]

    def judge(answers: list) -> dict[str, Access]:
        stored = dict(zip(granted, answers[1:] if names else answers, strict=True))
        namespaces = dict(zip(names, answers[0], strict=True)) if names else {}
        now, found, unknown = time.time(), {}, []
        for channel in checked:
            if channel not in named:
                found[channel] = _read_default(channel, user_id, is_admin)
                continue
            split = named[channel]
            namespace = parse_namespace(split[0], namespaces.get(split[0])) if split else None
            deciding = None if is_admin else deciding_key(channel, namespace)
            if deciding is not None and read.get(channel) != deciding:
                unknown.append(channel)
            else:
                found[channel] = _read_named(namespace, stored.get(channel), is_admin, now)
        if unknown:
            found.update(current_access(client, user_id, is_admin, unknown))
        return found

    return Recheck(commands, judge)


def check_subscribe(
    client, user_id: str, is_admin: bool, channels: list[str], proxy=None, namespaces_read: dict | None = None
) -> dict[str, Access]:
    """The Access of each channel a request names: 400 for a malformed name, 404 for a channel whose
    namespace does not exist, 403 when any is not allowed.

    A channel of a `proxy` namespace the user holds no grant of is asked about (`proxy`, the app's
    SubscribeProxy, app/channels/proxy.py), and read again once granted: 403 when refused, 503 when the
    backend did not answer (also without a `proxy` to ask). Only here: re-checks never ask. `namespaces_read`: the
    namespaces' stored texts this request has read already (the proxy's answer is judged on a fresh read)."""
    for channel in channels:
        if not (_own_channel(channel) or split_channel(channel)):
            raise bad_request(f"{channel[:200]!r} is not a channel name (<namespace>:<name>).")
    access = current_access(client, user_id, is_admin, channels, namespaces_read)
    for channel, found in access.items():
        if found.reason == NO_NAMESPACE:
            raise not_found(f"No namespace of channel {channel!r}.")
    refused = {channel: found.namespace for channel, found in access.items() if not found.allowed}
    for channel, namespace in refused.items():
        if namespace is None or namespace.subscribe != "proxy":
            raise forbidden(f"You may not subscribe to {channel!r}.")
    if refused:
        if proxy is None:
            raise ApiError(503, "unavailable", "Subscribing through a proxy is not possible here.")
        proxy.admit(client, user_id, refused)
        access.update(current_access(client, user_id, is_admin, list(refused)))
        for channel in refused:
            if not access[channel].allowed:
                raise forbidden(f"You may not subscribe to {channel!r}.")
    _register_org_channels(client, access)
    return access


def _register_org_channels(client, access: dict[str, Access]) -> None:
    """Note each channel of an org namespace among the organization's channels before it is subscribed to, so that
    a member's loss of it can be announced on the channel itself (app/orgs/live.py)."""
    orgs = {
        channel: org_of_channel(split_channel(channel)[1])
        for channel, found in access.items()
        if found.namespace is not None and found.namespace.by_org
    }
    if not any(orgs.values()):
        return
    pipe = client.pipeline(transaction=False)  # one key each: fine across hash slots
    for channel, org_id in orgs.items():
        if org_id:
            pipe.sadd(Keys.org_channels(org_id), channel)
    pipe.execute()


def check_publish(client, channel: str, *, user_id: str | None, is_admin: bool, api_key) -> Namespace | None:
    """The channel's namespace (None for other channels) when the caller may publish there; else 403,
    or 404 for a channel of a namespace that does not exist.

    Channels outside namespaces keep section 4's rules: users their own channel, admins any, keys their
    list. In a namespace, `server`: admins and keys whose channels cover it; `subscribers`: also users
    who may subscribe (granted users, or the organization's members the namespace admits).
    """
    split = split_channel(channel)
    if split is None or split[0] == "user":
        if api_key is not None and not api_key.may_publish(channel):
            raise forbidden(f"This API key may not publish to {channel!r}.")
        if api_key is None and not (is_admin or channel == user_channel(user_id or "")):
            raise forbidden("You may publish only to your own channel.")
        return None
    namespace = get_namespace(client, split[0]) if split[0] not in RESERVED else None
    if namespace is None:
        raise not_found(f"No namespace of channel {channel!r}.")
    if api_key is not None:
        if not api_key.may_publish(channel):
            raise forbidden(f"This API key may not publish to {channel!r}.")
    elif not is_admin:
        if namespace.publish != "subscribers" or user_id is None:
            raise forbidden(f"Only the server publishes to {channel!r}.")
        deciding = deciding_key(channel, namespace)
        stored = client.hget(deciding, user_id) if deciding is not None else None
        if not _read_named(namespace, stored, False, time.time()).allowed:
            raise forbidden(f"You may not publish to {channel!r}.")
    return namespace
