"""Membership changes reach open connections: a member who lost an organization's channel loses it at once.

Each channel of an org namespace someone subscribed to is noted among the organization's channels
(`Keys.org_channels`, app/channels/access.py). A member's loss of access to one of them is announced on the
channel's own wake-up channel, as a revoked grant is: in order with the channel's events, so nothing published
after a removal reaches the removed member, on one Redis or across a cluster's shards. Every worker is also told
on the control channel, and checks again the subscriptions naming the organization (any channel not noted).
"""

from __future__ import annotations

from flask import current_app

from ..auth.sessions import member_role
from ..channels.namespaces import get_namespaces, split_channel
from ..redis import Keys, get_redis


def announce_org_changed(org_id: str, user_id: str | None = None) -> None:
    """A user's membership of `org_id` ended or its role changed (`user_id`), or the organization is gone
    (None): whoever may no longer read one of its channels loses it on every open connection."""
    bus = current_app.extensions["event_bus"]
    for channel in _channels_lost(org_id, user_id):
        bus.announce_access_changed("revoked", channel=channel, user_id=user_id)
    bus.announce_org_changed(org_id, user_id)


def _channels_lost(org_id: str, user_id: str | None) -> list[str]:
    """The organization's noted channels the user (everyone, for None) may no longer read, by their namespaces'
    rules and the user's role now. Once the organization is gone, its note goes too."""
    client = get_redis()
    channels = sorted(client.smembers(Keys.org_channels(org_id)))
    if user_id is None:
        client.delete(Keys.org_channels(org_id))
    if not channels:
        return []
    split = {channel: split_channel(channel) for channel in channels}
    namespaces = get_namespaces(client, {parts[0] for parts in split.values() if parts})
    role = member_role(client.hget(Keys.org_members(org_id), user_id)) if user_id is not None else None
    lost = []
    for channel, parts in split.items():
        namespace = namespaces.get(parts[0]) if parts else None
        if namespace is not None and namespace.by_org and not namespace.admits_role(role):
            lost.append(channel)
    return lost
