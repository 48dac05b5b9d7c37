"""Outgoing webhooks: events delivered to other systems' URLs, signed, retried, at least once.

The web workers manage endpoints and read messages (views); the delivery process (`worker:` in the
Procfile, app/outgoing/delivery.py) sends them. Publishing feeds them: on one Redis in the same atomic
step that appends an event (app/events/bus.py), on a cluster as the publisher's next step (feed.py).
The same delivery process sends the OpenID provider's back-channel logouts (backchannel.py).
"""

from __future__ import annotations

from flask import Flask


def init_app(app: Flask) -> None:
    """Bind the store of endpoints and messages (and of back-channel logout targets), and add the backlog to
    /metrics."""
    # Imported here: the bus imports feed.py, and the store imports the bus.
    from .backchannel import Targets
    from .backlog import BacklogCollector
    from .store import OutgoingStore

    settings = app.config["SETTINGS"]
    replicated = settings.event_durability == "replicated"
    store = OutgoingStore(app.extensions["redis"], settings.outgoing_webhooks, replicated=replicated)
    app.extensions["outgoing_store"] = store
    app.extensions["backchannel_targets"] = Targets(app.extensions["redis"], settings.outgoing_webhooks)
    app.extensions.setdefault("metrics_collectors", []).append(BacklogCollector(store))
