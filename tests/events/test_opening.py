"""What a live connection reads as it opens: its lease, its session once more, where its channels stand and
its history, in one round trip after the subscription (Bus.opening; on a Redis Cluster the two scripts go
on their own). Against gunicorn and the session's real Redis, in both modes."""

from __future__ import annotations

import threading
import uuid

import pytest

from app.channels.namespaces import Namespace, put_namespace
from app.events.bus import wake_channel
from app.redis import Keys
from tests.events.clients import SSE, Api
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until

CAP = 30  # connections per user: the module's streams of one user at once


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """One worker (a worker's own subscription and leases are watched) that caps a user's connections at CAP."""
    env = {**base_env, **FAST, "MAX_CONNECTIONS_PER_USER": str(CAP)}
    live = LiveServer(env, workers=1, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


def held_leases(client, user_id: str) -> int:
    return client.zcard(Keys.connection_leases(user_id))


def subscribers(client, channel: str) -> int:
    """How many pub/sub connections Redis holds subscribed to the channel's wake-ups (sharded on a cluster)."""
    if hasattr(client, "get_nodes"):
        node = client.get_node_from_key(wake_channel(channel))
        return client.pubsub_shardnumsub(wake_channel(channel), target_nodes=node)[0][1]
    return client.pubsub_numsub(wake_channel(channel))[0][1]


def test_a_stream_opened_after_a_script_flush_holds_its_lease_and_reads_its_history(server, rdb):
    user = Api(server.url)
    cursor = user.current_cursor()
    published = [user.publish_ok({"n": n}) for n in range(3)]
    rdb.script_flush()  # the lease's and the session's EVALSHA find no script

    stream = SSE(server.url, user.auth, cursor=cursor)
    try:
        assert stream.status == 200
        assert [event["data"]["id"] for event in stream.events(3)] == published
        assert held_leases(rdb, user.user_id) == 1
        after = user.publish_ok({"n": 3})  # and live after its history
        assert stream.next_event()["data"]["id"] == after
    finally:
        stream.close()
    wait_until(lambda: held_leases(rdb, user.user_id) == 0, message="the lease given back")


def test_a_stream_past_the_users_cap_is_refused_and_lets_its_subscription_go(server, rdb):
    user = Api(server.url)
    streams = []
    try:
        for _ in range(CAP):
            streams.append(stream := SSE(server.url, user.auth))
            assert stream.status == 200
            stream.next(skip_comments=False)
        assert held_leases(rdb, user.user_id) == CAP
        assert subscribers(rdb, user.channel) == 1

        refused = SSE(server.url, user.auth)
        assert refused.status == 429
        assert b"too_many_connections" in refused.body
        assert held_leases(rdb, user.user_id) == CAP
    finally:
        for stream in streams:
            stream.close()
    # The refused stream subscribed before its lease was refused; had it kept the subscription, the worker
    # would still be subscribed to the user's channel once the streams that streamed are gone.
    wait_until(lambda: subscribers(rdb, user.channel) == 0, message="the user's channel let go")
    wait_until(lambda: held_leases(rdb, user.user_id) == 0, message="the lease given back")  # after the unsubscription


def test_streams_that_end_together_give_back_every_lease(server, rdb):
    """Leases given back at once share round trips (ConnectionLeases.release); none may be lost in them."""
    user = Api(server.url)
    streams = [SSE(server.url, user.auth) for _ in range(CAP)]
    try:
        assert all(stream.status == 200 for stream in streams)
        wait_until(lambda: held_leases(rdb, user.user_id) == CAP, message="every stream's lease held")
    finally:
        for stream in streams:
            stream.close()
    wait_until(lambda: held_leases(rdb, user.user_id) == 0, message="every lease given back")


def commands_while(client, action) -> list[dict]:
    """Every command Redis ran while `action` ran (MONITOR), each with the client address it came from."""
    marker, seen = f"marker-{uuid.uuid4().hex}", []
    with client.monitor() as monitor:

        def read() -> None:
            while marker not in (command := monitor.next_command())["command"]:
                seen.append(command)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        action()
        client.echo(marker)
        reader.join(timeout=10)
    assert not reader.is_alive(), "the marker never came"
    return seen


@pytest.mark.not_on_cluster("on a cluster the session and the namespaces live on different nodes: a round trip each")
def test_a_named_channels_stream_reads_its_namespaces_in_its_session_checks_round_trip(server, rdb):
    put_namespace(rdb, Namespace("opening", "authenticated"))
    user = Api(server.url)
    streams = []
    seen = commands_while(rdb, lambda: streams.append(SSE(server.url, user.auth, params={"channels": "opening:a"})))
    try:
        assert streams[0].status == 200
    finally:
        streams[0].close()
    where = [(command["client_address"], command["client_port"]) for command in seen]
    texts = [command["command"] for command in seen]
    check = next(n for n, text in enumerate(texts) if text.startswith("EVALSHA") and Keys.user(user.user_id) in text)
    read = next(n for n, text in enumerate(texts) if text.startswith(f"HMGET {Keys.namespaces()} opening"))
    assert check < read  # the session first, as the view checks it
    after_check = [n for n in range(check + 1, len(seen)) if where[n] == where[check]]
    assert after_check and after_check[0] == read  # the next command on the session check's connection


@pytest.mark.not_on_cluster("the namespaces go in the session check's round trip on one Redis only")
def test_a_named_channels_stream_is_judged_on_its_session_first_then_on_its_namespaces(server, rdb):
    """Through the worker's combined round trip: 404 for a namespace that does not exist, and, once the session has
    ended, 401 whatever the channels (never 403 or 404)."""
    put_namespace(rdb, Namespace("judged", "members"))
    user = Api(server.url)
    for channels, status in (("judged:a", 403), ("nowhere:a", 404), ("judged:a,nowhere:a", 404)):
        refused = SSE(server.url, user.auth, params={"channels": channels})
        assert refused.status == status, (channels, refused.body)
    user.logout_all()
    for channels in ("judged:a", "nowhere:a", "opening:a"):
        refused = SSE(server.url, user.auth, params={"channels": channels})
        assert refused.status == 401 and b"session has ended" in refused.body, (channels, refused.body)
