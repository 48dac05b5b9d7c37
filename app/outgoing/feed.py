"""Feeding published events to outgoing webhooks on a Redis Cluster.

On one Redis the publish script appends each event to the feed (`outgoing:feed`) in the same atomic step
that stores it, while any endpoint exists. On a cluster the feed and a channel's stream live in different
hash slots, so no script can do both: the publisher appends to the feed as a second step, after the event
is stored and before it answers. This module imports only the key names and replicas.py, so the bus may import it.
"""

from __future__ import annotations

import time
import weakref

from ..redis import Keys
from .replicas import execute_replicated

# After the set of endpoints was last seen non-empty, publishers skip the check for this long. Only the
# positive answer is kept: an endpoint created (and answered) before a publish always gets its events;
# a deleted last endpoint costs at most this long of feed entries that the dispatcher acknowledges.
SEEN_FOR = 1.0

_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # client -> time.monotonic() of last "yes"


def feed_events(client, events, replicated: bool = False) -> int:
    """Append published events to the outgoing-webhook feed while any endpoint exists; how many were appended.

    Contract (cluster mode only; on one Redis the publish script does this itself, so the caller must
    not call it there):

    - `client` is the app's Redis client (`app.extensions["redis"]`); `events` are the events just
      stored, in publish order, each with `id`, `channel`, `event`, `data` (the JSON text as stored)
      and `ts` - e.g. the `Event` that `Bus.publish` returns, or one per id of `Bus.publish_many`.
    - `replicated` (EVENT_DURABILITY=replicated): the entries are confirmed by a replica of the feed's
      node (WAIT on the appending connection), else NotReplicated (a redis ConnectionError) is raised.
    - Call it after the publish script has succeeded and before answering 201; if it raises (a Redis
      error), the request must fail (503 for a connection error) without a 201: the event is stored but
      may not reach webhooks, and the publisher's retry publishes it again. Acknowledged events are so
      fed at least once; the dispatcher makes one message per (endpoint, event) whatever the repeats.
    - Cost: one round trip (XADD, pipelined for a batch, all to the feed's node) while endpoints exist;
      one more (SCARD) at most once a second per client, or on every publish while there is none.
    """
    if not events or not _endpoints_exist(client):
        return 0
    feed = Keys.outgoing_feed()

    def append(pipe) -> None:
        for event in events:
            fields = {
                "id": event.id,
                "channel": event.channel,
                "event": event.event,
                "data": event.data,
                "ts": event.ts,
            }
            if getattr(event, "sender", None) is not None:
                fields["from"] = event.sender
            pipe.xadd(feed, fields)

    if replicated:
        execute_replicated(client, feed, append)
    elif len(events) == 1:
        append(client)  # a cluster pipeline costs about a round trip more than the command itself
    else:
        pipe = client.pipeline(transaction=False)
        append(pipe)
        pipe.execute()
    return len(events)


def _endpoints_exist(client) -> bool:
    now = time.monotonic()
    if now - _seen.get(client, -SEEN_FOR) < SEEN_FOR:
        return True
    if client.scard(Keys.outgoing_endpoints()):  # EXISTS costs twice as much through the cluster client
        _seen[client] = now
        return True
    return False
