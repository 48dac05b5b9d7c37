"""A hub link's listener survives a confirmation that arrives for a connection given up meanwhile."""

from __future__ import annotations

from types import SimpleNamespace

from app.events.links import Link


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
    assert link._handle({"type": "subscribe", "channel": "wake:{chat:room}"}) is False
    assert link._handle({"type": "ssubscribe", "channel": "wake:{chat:room}"}) is False
    assert not link.unconfirmed
