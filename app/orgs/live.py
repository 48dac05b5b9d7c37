"""Membership changes reach open connections: every worker checks again the subscriptions they concern."""

from __future__ import annotations

from flask import current_app


def announce_org_changed(org_id: str, user_id: str | None = None) -> None:
    """A user's membership of `org_id` ended or its role changed (`user_id`), or the organization is gone
    (None): the organization's channels are checked again on every open connection, within a second."""
    current_app.extensions["event_bus"].announce_org_changed(org_id, user_id)
