"""A hub link's listener survives a confirmation that arrives for a connection given up meanwhile, and reads
what Redis sends whole."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import redis

from app.events.links import Link, Replies


def idle_link() -> Link:
    """A link whose listener greenlet never runs: its answers are handled by hand."""
    link = Link(SimpleNamespace(topology=SimpleNamespace(sharded=False)), "redis://127.0.0.1:1/0")
    link.greenlet.kill(block=False)
    return link


def test_a_subscribe_answer_after_the_connection_was_given_up_is_ignored():
    # While the listener fans out events it yields; a reader whose confirmation timed out may then give
    # the connection up (`lost`), which forgets every unconfirmed SUBSCRIBE. The answer read before that
    # must not end the listener (it raised IndexError from an empty queue and the worker went deaf).
    link = idle_link()
    assert link._handle("subscribe", "wake:{chat:room}") is False
    assert link._handle("ssubscribe", "wake:{chat:room}") is False
    assert not link.unconfirmed


# What a link reads (Replies), against a real Redis.


@pytest.fixture
def subscriber(redis_servers):
    """A hub-like pub/sub connection (decoded replies, hiredis) to the session's one Redis, and a publisher."""
    server = redis_servers("standalone")
    client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=10)
    pubsub = client.pubsub()
    pubsub.connection = pubsub.connection_pool.get_connection()
    yield pubsub, client
    pubsub.close()
    client.close()


def test_replies_come_whole_one_by_one_and_buffered_ones_without_waiting(subscriber):
    pubsub, client = subscriber
    replies = Replies(pubsub.connection)
    assert replies.buffered() is None  # nothing received: no wait for Redis
    pubsub.subscribe("links-test")
    assert list(replies.next()) == ["subscribe", "links-test", 1]
    big = "x" * 200_000  # three times what one read takes
    for data in ("first", big, "third"):
        client.publish("links-test", data)
    assert list(replies.next()) == ["message", "links-test", "first"]
    assert list(replies.next()) == ["message", "links-test", big]
    third = replies.buffered() or replies.next()
    assert list(third) == ["message", "links-test", "third"]
    assert replies.buffered() is None


def test_an_error_reply_is_raised(subscriber):
    pubsub, _ = subscriber
    replies = Replies(pubsub.connection)
    pubsub.connection.send_command("NO-SUCH-COMMAND")
    with pytest.raises(redis.exceptions.ResponseError):
        replies.next()


def test_a_connection_redis_closes_is_a_connection_error(subscriber):
    pubsub, client = subscriber
    replies = Replies(pubsub.connection)
    pubsub.connection.send_command("CLIENT", "ID")
    own_id = replies.next()
    pubsub.subscribe("links-test")
    replies.next()
    client.execute_command("CLIENT", "KILL", "ID", own_id)
    with pytest.raises(redis.exceptions.ConnectionError):
        replies.next()


def test_a_link_waits_past_the_sockets_time_out(redis_servers):
    # redis-py gives a connection's socket a time-out (5 s by default); a link waits for events as long as it
    # takes. A link that gave up at the time-out was lost and replaced, and every reader resynchronised.
    server = redis_servers("standalone")
    client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=0.3)
    pubsub = client.pubsub()
    pubsub.connection = pubsub.connection_pool.get_connection()
    replies = Replies(pubsub.connection)
    pubsub.subscribe("links-idle")
    replies.next()
    publisher = redis.Redis.from_url(server.url)
    late = threading.Timer(1.0, lambda: publisher.publish("links-idle", "late"))
    late.start()
    try:
        assert list(replies.next()) == ["message", "links-idle", "late"]
        assert pubsub.connection._sock.gettimeout() == 0.3  # the socket's own time-out is back for its writes
    finally:
        late.cancel()
        late.join()  # its PUBLISH answered before its client closes
        publisher.close()
        pubsub.close()
        client.close()
