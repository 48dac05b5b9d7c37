"""Real-time delivery: one Redis-backed bus read by polling, long polling, SSE and WebSocket."""

from __future__ import annotations

from flask import Flask

from ..auth.sessions import sessions_ended
from ..channels import presence
from ..channels.access import current_access
from ..redis import is_cluster
from . import sse, ws  # noqa: F401 - they add their routes to the events blueprint
from .bus import Bus
from .hub import Hub
from .leases import ConnectionLeases
from .links import Cluster, OneServer


def end_live_connections(app: Flask) -> None:
    """The worker is shutting down: end this app's live connections (clients resume elsewhere by cursor)."""
    app.extensions["event_hub"].shutdown()


def init_app(app: Flask) -> None:
    """Bind the event bus, the hub and connection leases; close live connections when sessions end."""
    settings = app.config["SETTINGS"]
    client = app.extensions["redis"]
    bus = Bus(
        client,
        app.extensions["redis_scripts"],
        settings.event_history_maxlen,
        settings.event_durability,
        history_ttl=settings.event_history_ttl,
    )
    app.extensions["event_bus"] = bus
    topology = Cluster(client, settings.redis_url) if is_cluster(client) else OneServer(settings.redis_url)
    app.extensions["event_hub"] = Hub(topology, access=lambda *asked: current_access(client, *asked))
    presence.init_app(app)
    app.extensions["connection_leases"] = ConnectionLeases(
        client, settings.max_connections_per_user, redis_url=settings.redis_url
    )
    sse.init_app(app)
    ws.init_app(app)

    def close_live_connections(sender, user_id, session_ids, whole_user=False, **_):
        bus.announce_sessions_ended(user_id, session_ids, whole_user)

    sessions_ended.connect(close_live_connections, sender=app, weak=False)
