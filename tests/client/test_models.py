"""The client's typed answers, from JSON: what they keep and what they refuse."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from auth_rt_client import Event, Member, Namespace, Presence, PresentUser, ProtocolError

EVENT = {"id": "1-0", "channel": "chat:lobby", "event": "message", "data": {"text": "hi"}, "ts": "2030-01-01T00:00:00Z"}


def test_an_event_keeps_who_sent_it():
    assert Event.from_json({**EVENT, "from": "u1"}).sender == "u1"
    assert Event.from_json(EVENT).sender is None  # an API key, the CLI, a webhook, or the service itself
    with pytest.raises(ProtocolError):
        Event.from_json({**EVENT, "from": 5})
    with pytest.raises(ProtocolError):
        Event.from_json(["not", "an", "event"])


def test_channel_answers_become_typed_values():
    namespace = {"name": "chat", "subscribe": "members", "publish": "server", "presence": True, "join_leave": False}
    assert Namespace.from_json(namespace) == Namespace("chat", "members", "server", True, False)
    member = Member.from_json({"user_id": "u1", "info": {"name": "Ada"}, "expires_at": "2030-01-01T00:00:00Z"})
    assert member.expires == datetime(2030, 1, 1, tzinfo=UTC)
    assert Member(user_id="u2", expires_at=1_893_456_000).expires == datetime(2030, 1, 1, tzinfo=UTC)
    presence = Presence.from_json(
        {"channel": "chat:lobby", "count": 1, "users": [{"user_id": "u1", "info": None, "connections": 2}]}
    )
    assert presence.users == (PresentUser("u1", None, 2),) and presence.user_ids == ["u1"]


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (Namespace, {"name": "chat"}),
        (Member, {"info": {}}),
        (Presence, {"channel": "chat:lobby", "count": "1", "users": []}),
        (Presence, {"channel": "chat:lobby", "count": 1, "users": [{"user_id": "u1"}]}),
    ],
)
def test_an_answer_of_another_shape_is_a_protocol_error(kind, value):
    with pytest.raises(ProtocolError):
        kind.from_json(value)
