"""Writes acknowledged only once a replica has them (`EVENT_DURABILITY=replicated`).

Replication is asynchronous: a primary that fails over loses what it acknowledged but had not yet sent
to its replica. WAIT counts the replicas that have every write made so far *on the same connection*, so
the writes and their WAIT go in one pipeline on the node that serves their keys (on a cluster, through
that node's own client).
"""

from __future__ import annotations

import contextlib

import redis

from ..redis import is_cluster

REPLICA_WAIT_MILLISECONDS = 1000  # how long a write waits for a replica before it counts as failed


class NotReplicated(redis.exceptions.ConnectionError):
    """No replica confirmed in time: treated like Redis being away (retried, or 503 to a caller)."""


def node_client(client, key: str):
    """The client of the node that serves `key` (the client itself on one Redis)."""
    if not is_cluster(client):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


def execute_replicated(client, key: str, queue) -> list:
    """Run what `queue(pipe)` adds to a pipeline on the node serving `key`, then WAIT for one replica.

    Every key the queued commands name must be in `key`'s slot. The results, in order; NotReplicated
    when no replica confirmed in time. A slot that moved or a node that is gone refreshes the cluster's
    map and raises: the caller's steps are safe to run again.
    """
    try:
        pipe = node_client(client, key).pipeline(transaction=False)
        queue(pipe)
        pipe.execute_command("WAIT", 1, REPLICA_WAIT_MILLISECONDS)
        results = pipe.execute()
    except (redis.exceptions.MovedError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        if is_cluster(client):  # past this node: the next attempt asks the cluster who serves the slot now
            with contextlib.suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                client.nodes_manager.initialize()
        raise
    if int(results.pop()) < 1:
        raise NotReplicated(f"no replica confirmed the writes within {REPLICA_WAIT_MILLISECONDS} ms")
    return results
