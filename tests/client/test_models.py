"""The client's typed answers, from JSON: what they keep and what they refuse."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from auth_rt_client import (
    ApiError,
    Event,
    ExternalIdentity,
    Member,
    Namespace,
    Presence,
    PresentUser,
    ProtocolError,
    Tokens,
    User,
)

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
        (
            Namespace,
            {"name": "p", "subscribe": "proxy", "publish": "server", "presence": 0, "join_leave": 0, "proxy_url": 1},
        ),
        (User, {"id": "u1", "email": None, "role": "user", "external": {"issuer": "auth0"}}),
        (User, {"id": "u1", "email": 7, "role": "user"}),
    ],
)
def test_an_answer_of_another_shape_is_a_protocol_error(kind, value):
    with pytest.raises(ProtocolError):
        kind.from_json(value)


def test_a_proxy_namespace_keeps_its_url_and_the_secret_shown_once():
    value = {"name": "rooms", "subscribe": "proxy", "publish": "server", "presence": True, "join_leave": False}
    made = Namespace.from_json({**value, "proxy_url": "https://app.example/may", "proxy_secret": "whsec_abc"})
    assert (made.proxy_url, made.proxy_secret) == ("https://app.example/may", "whsec_abc")
    assert "whsec_abc" not in repr(made)
    assert Namespace.from_json(value) == Namespace("rooms", "proxy", "server", True, False)


TOKENS = {
    "access_token": "eyJ.access",
    "refresh_token": "opaque-refresh",
    "token_type": "Bearer",
    "expires_in": 900,
    "refresh_expires_in": 2_592_000,
    "session_id": "s1",
    "user": {"id": "u1", "email": None, "role": "user", "external": {"issuer": "auth0", "sub": "auth0|42"}},
    "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
}


def test_an_exchanged_session_is_tokens_of_an_external_user_that_never_shows_them():
    before = datetime.now(UTC)
    tokens = Tokens.from_json(TOKENS)
    assert tokens.user == User("u1", None, "user", ExternalIdentity("auth0", "auth0|42"))
    assert 899 <= (tokens.expires_at - before).total_seconds() <= 901
    assert "eyJ.access" not in repr(tokens) and "opaque-refresh" not in repr(tokens)
    with pytest.raises(ProtocolError) as raised:
        Tokens.from_json({**TOKENS, "expires_in": "900"})
    assert "eyJ.access" not in str(raised.value)  # a malformed answer is not echoed: it holds tokens


def test_the_token_endpoints_errors_in_oauths_shape_become_api_errors():
    body = {"error": "invalid_grant", "error_description": "The token has expired."}
    error = ApiError.from_response(httpx.Response(400, json=body))
    assert (error.status, error.code, error.message) == (400, "invalid_grant", "The token has expired.")
    bare = ApiError.from_response(httpx.Response(400, json={"error": "invalid_request"}))
    assert (bare.code, bare.message) == ("invalid_request", "invalid_request")
