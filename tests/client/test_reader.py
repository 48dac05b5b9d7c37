"""`EventReader` against the live service: order, cursors, resuming across transports, dropped
connections and killed workers, ended sessions, fresh tokens, the connection cap and `close()`."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from auth_rt_client import ApiError, Client, EventReader

from tests.client.collector import Collector
from tests.events.clients import SSE, Api, open_connections
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until

pytestmark = pytest.mark.not_on_cluster(
    "the client speaks HTTP; the service's cluster paths are tested in tests/events"
)

TRANSPORTS = ["sse", "long-poll"]


def reader(server: LiveServer, token, transport: str, **options) -> EventReader:
    return EventReader(server.url, token, transport=transport, wait_seconds=2, **options)


def publish(server: LiveServer, key: str, channel: str, count: int, start: int = 0) -> list[str]:
    with Client(server.url, key) as client:
        return client.publish_batch([{"channel": channel, "event": "n", "data": {"n": n}} for n in range(start, count)])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_events_arrive_in_order_with_every_field(server, keys, transport):
    user = Api(server.url)
    collector = Collector(reader(server, user.access_token, transport))
    try:
        ids = publish(server, keys.publisher, user.channel, 5)
        tricky = {"text": "line\u2028sep\u0085next\x0cfeed\r\nend", "nested": [1, {"a": None}]}
        with Client(server.url, keys.publisher) as client:
            ids.append(client.publish(user.channel, "order.paid", tricky).id)
        events = collector.events(6)
        assert [e.id for e in events] == ids
        assert [e.data for e in events] == [{"n": n} for n in range(5)] + [tricky]
        assert {e.channel for e in events} == {user.channel} and events[-1].event == "order.paid"
        assert events[-1].published_at.tzinfo is not None
        assert user.poll(collector.reader.cursor).status_code == 204  # the cursor stands after the last event
    finally:
        collector.stop()


@pytest.mark.parametrize("first", TRANSPORTS)
@pytest.mark.parametrize("second", TRANSPORTS)
def test_a_saved_cursor_resumes_exactly_where_the_last_reader_stopped(server, keys, first, second):
    user = Api(server.url)
    collector = Collector(reader(server, user.access_token, first))
    try:
        before = publish(server, keys.publisher, user.channel, 3)
        assert [e.id for e in collector.events(3)] == before
        saved = collector.reader.cursor
    finally:
        collector.stop()
    missed = publish(server, keys.publisher, user.channel, 6, start=3)  # while no reader runs
    resumed = Collector(reader(server, user.access_token, second, cursor=saved))
    try:
        assert [e.id for e in resumed.events(3)] == missed  # none again, none lost
        later = publish(server, keys.publisher, user.channel, 7, start=6)
        assert [e.id for e in resumed.events(1)] == later
    finally:
        resumed.stop()


@pytest.mark.parametrize(("transport", "limit"), [("sse", None), ("long-poll", 1)])
def test_the_cursor_after_each_event_resumes_after_that_event(server, keys, transport, limit):
    user = Api(server.url)
    collector = Collector(reader(server, user.access_token, transport, limit=limit))
    try:
        ids = publish(server, keys.publisher, user.channel, 5)
        taken = collector.take(5)
    finally:
        collector.stop()
    assert [event.id for event, _ in taken] == ids
    persisted_after_second = taken[1][1]
    resumed = Collector(reader(server, user.access_token, transport, cursor=persisted_after_second))
    try:
        assert [e.id for e in resumed.events(3)] == ids[2:]
    finally:
        resumed.stop()


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_workers_lose_nothing_and_repeat_nothing(server, keys, transport):
    user = Api(server.url)
    collector = Collector(reader(server, user.access_token, transport))
    try:
        first = publish(server, keys.publisher, user.channel, 3)
        assert [e.id for e in collector.events(3)] == first
        for pid in server.worker_pids():
            os.kill(pid, signal.SIGKILL)  # the arbiter starts new workers; the reader's connection drops
        during = publish(server, keys.publisher, user.channel, 13, start=3)
        assert [e.id for e in collector.events(10, timeout=30)] == during
        after = publish(server, keys.publisher, user.channel, 15, start=13)
        assert [e.id for e in collector.events(2)] == after
        assert collector.received.empty()
    finally:
        collector.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_ended_session_raises_401(server, transport):
    user = Api(server.url)
    collector = Collector(reader(server, user.access_token, transport))
    if transport == "long-poll":
        wait_until(lambda: open_connections(server.url, "long_poll") >= 1, message="the long poll to be held")
    user.logout_all()
    error = collector.raised()
    assert isinstance(error, ApiError) and error.status == 401
    collector.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_token_function_gives_each_reconnection_a_fresh_token(server, keys, transport):
    user = Api(server.url)
    logins = []

    def token() -> str:
        """What a backend would do: keep its token while introspection says it is active, else log in."""
        with Client(server.url, keys.publisher) as client:
            if not client.introspect(user.access_token).active:
                user.login()
                logins.append(user.session_id)
        return user.access_token

    collector = Collector(reader(server, token, transport))
    try:
        before = publish(server, keys.publisher, user.channel, 2)
        assert [e.id for e in collector.events(2)] == before
        user.logout_all()  # the reader's connection ends; its next token is a new session's
        meanwhile = publish(server, keys.publisher, user.channel, 5, start=2)
        assert [e.id for e in collector.events(3, timeout=20)] == meanwhile
        assert len(logins) == 1
    finally:
        collector.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_malformed_cursor_raises_400(server, transport):
    user = Api(server.url)
    with pytest.raises(ApiError) as raised:
        next(iter(reader(server, user.access_token, transport, cursor="not a cursor")))
    assert (raised.value.status, raised.value.code) == (400, "bad_request")


def test_close_ends_a_held_long_poll_at_once(server):
    user = Api(server.url)
    collector = Collector(EventReader(server.url, user.access_token, transport="long-poll", wait_seconds=25))
    wait_until(lambda: open_connections(server.url, "long_poll") >= 1, message="the long poll to be held")
    started = time.monotonic()
    collector.stop()
    assert time.monotonic() - started < 2 and collector.error is None


@pytest.fixture(scope="module")
def capped_server(base_env, tmp_path_factory):
    """One connection per user and a short history; shared by the tests that need them, each with its own user."""
    env = {**base_env, **FAST, "MAX_CONNECTIONS_PER_USER": "1", "EVENT_HISTORY_MAXLEN": "10"}
    live = LiveServer(env, workers=1, log_path=tmp_path_factory.mktemp("capped") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.mark.slow
def test_past_the_connection_cap_the_reader_waits_for_retry_after(capped_server):
    user = Api(capped_server.url)
    held = SSE(capped_server.url, user.auth)
    assert held.status == 200
    collector = Collector(reader(capped_server, user.access_token, "sse"))
    try:
        refused = ApiError.from_response(httpx.get(f"{capped_server.url}/events/stream", headers=user.auth))
        assert (refused.status, refused.code, refused.retry_after) == (429, "too_many_connections", 5.0)
        assert refused.retryable
        refused_at = time.monotonic()
        held.close()
        published = user.publish_ok({"after": "cap"})
        [event] = collector.events(1, timeout=20)
        assert event.id == published and time.monotonic() - refused_at > 3  # Retry-After: 5 was honoured
    finally:
        collector.stop()


def test_a_cursor_older_than_the_history_yields_reset_first(capped_server):
    user = Api(capped_server.url)
    cursor = user.current_cursor()
    ids = [user.publish_ok({"n": n}) for n in range(250)]  # far past the kept history (trimmed roughly)
    collector = Collector(reader(capped_server, user.access_token, "long-poll", cursor=cursor))
    try:
        first, *rest = collector.events(2)
        assert (first.event, first.id, first.channel) == ("reset", "0-0", user.channel)
        assert rest[0].id in ids[1:]  # the oldest were dropped
    finally:
        collector.stop()
