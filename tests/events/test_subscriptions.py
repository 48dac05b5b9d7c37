"""Per-channel subscriptions: a worker subscribes to a channel's wake-ups only while it has a reader of it,
counts its readers, and never lets an event fall between subscribing and reading history, through churn
and a Redis restart."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from app.events.bus import wake_channel
from app.events.cursor import decode_cursor, is_after
from tests.events.clients import SSE, Api, open_connections
from tests.events.conftest import FAST
from tests.servers import LiveServer, RedisServer, wait_until

pytestmark = pytest.mark.not_on_cluster("the module starts its own redis-server (restarted, limited) to watch it")


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory):
    """A Redis of this module's own (persistent, so a restart keeps users and streams)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shared(base_env, own_redis, tmp_path_factory):
    """One worker on the module's Redis, shared by every test: each leaves it with no reader and its hub up
    (or reconnecting), and none depends on the default cap of connections per user."""
    env = {**base_env, **FAST, "REDIS_URL": own_redis.url, "MAX_CONNECTIONS_PER_USER": "100"}
    live = LiveServer(env, workers=1, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.fixture
def live(shared, own_redis):
    """The shared worker once nothing of an earlier test is subscribed on it: its hub holds the control channel
    alone, or is not connected (after a Redis restart, or before the first stream)."""

    def idle():
        pid = shared.worker_pids()[0]
        hubs = [c for c in own_redis.client().client_list() if c["name"] == f"auth-rt-hub:{pid}"]
        return all(hub["sub"] == "1" and hub["psub"] == "0" for hub in hubs)

    wait_until(idle, timeout=20, message="the shared worker without readers")
    return shared


def subscribers(client, channel: str) -> int:
    """How many pub/sub connections Redis holds subscribed to the channel's wake-ups."""
    return client.pubsub_numsub(wake_channel(channel))[0][1]


def hub_of(client, live) -> dict:
    """The one worker's event hub connection as Redis lists it (it names itself auth-rt-hub:<pid>)."""
    (pid,) = live.worker_pids()
    (hub,) = [c for c in client.client_list() if c["name"] == f"auth-rt-hub:{pid}"]
    return hub


def connected(stream: SSE) -> SSE:
    """Wait for the stream's first frame: the server sends it after subscribing and reading history."""
    assert stream.status == 200
    stream.next(skip_comments=False)
    return stream


def test_a_worker_without_a_reader_of_a_channel_is_not_sent_its_events(live, start_server, own_redis):
    a = live
    b = start_server(workers=1, REDIS_URL=own_redis.url)
    redis_client = own_redis.client()
    alice, bob = Api(a.url), Api(b.url)
    alice_stream, bob_stream = connected(SSE(a.url, alice.auth)), connected(SSE(b.url, bob.auth))
    try:
        # The path delivers: A's worker is subscribed to Alice's channel, and an event published
        # through B reaches her reader on A.
        alice.base = b.url
        event_id = alice.publish_ok({"to": "alice"})
        assert alice_stream.next_event()["data"]["id"] == event_id
        assert subscribers(redis_client, alice.channel) == 1
        hub_a, hub_b = hub_of(redis_client, a), hub_of(redis_client, b)
        # Each hub holds control, broadcast and its own reader's channel, and no pattern. So B's worker,
        # where nobody reads Alice's channel, is not among its subscribers: Redis sends it none of her events.
        assert (hub_a["sub"], hub_a["psub"]) == ("3", "0")
        assert (hub_b["sub"], hub_b["psub"]) == ("3", "0")
        assert subscribers(redis_client, bob.channel) == 1
        assert subscribers(redis_client, "broadcast") == 2
        assert redis_client.pubsub_numpat() == 0
    finally:
        alice_stream.close()
        bob_stream.close()


def test_readers_are_counted_the_last_to_leave_unsubscribes(live, own_redis):
    redis_client = own_redis.client()
    user = Api(live.url)
    first, second = connected(SSE(live.url, user.auth)), connected(SSE(live.url, user.auth))
    assert subscribers(redis_client, user.channel) == 1  # one subscription per worker, however many readers
    first.close()
    wait_until(lambda: open_connections(live.url, "sse") == 1, message="the server noticing the first reader left")
    assert subscribers(redis_client, user.channel) == 1
    event_id = user.publish_ok({"n": 1})
    assert second.next_event()["data"]["id"] == event_id

    second.close()
    # Three unsubscriptions the hub makes one after another: wait for all of them, not for the first alone
    # (on a loaded machine the broadcast one came a moment after the user's).
    wait_until(
        lambda: (
            subscribers(redis_client, user.channel) == 0
            and subscribers(redis_client, "broadcast") == 0
            and hub_of(redis_client, live)["sub"] == "1"
        ),  # the control channel stays
        message="unsubscribed from the user's channel and broadcast after the last reader",
    )

    third = connected(SSE(live.url, user.auth))  # and a new reader subscribes again
    try:
        assert subscribers(redis_client, user.channel) == 1
        event_id = user.publish_ok({"n": 2})
        assert third.next_event()["data"]["id"] == event_id
    finally:
        third.close()


def unsubscribe_calls(client) -> int:
    return client.info("commandstats").get("cmdstat_unsubscribe", {}).get("calls", 0)


def test_a_streams_end_leaves_all_its_channels_in_one_command(live, own_redis):
    """The last reader of its user's channel and of broadcast ends: one UNSUBSCRIBE names both (a command each
    was a twentieth of a rooms run's server CPU, its streams ending)."""
    redis_client = own_redis.client()
    user = Api(live.url)
    stream = connected(SSE(live.url, user.auth))
    assert subscribers(redis_client, user.channel) == 1 and subscribers(redis_client, "broadcast") == 1
    before = unsubscribe_calls(redis_client)
    stream.close()
    wait_until(
        lambda: subscribers(redis_client, user.channel) == 0 and subscribers(redis_client, "broadcast") == 0,
        message="unsubscribed from both",
    )
    assert unsubscribe_calls(redis_client) == before + 1


def ids_after(published: list[str], cursor: str, channel: str) -> list[str]:
    position = decode_cursor(cursor, [channel])[channel]
    return [event_id for event_id in published if is_after(event_id, position)]


def test_readers_joining_and_leaving_one_channel_while_events_flow_miss_nothing(live, own_redis):
    """Readers come and go on one channel of one worker, so its subscription is dropped and taken again
    (UNSUBSCRIBE and SUBSCRIBE in flight together) while events are published. Every reader gets every
    event after its cursor, once, in order, for as long as it stays; readers that stay to the end get all."""
    own_redis.client().config_resetstat()  # unsubscriptions counted from here: earlier tests made some
    user = Api(live.url)
    publisher = Api(live.url, email=user.email, device="publisher")
    total = None  # known once the churners have had the channel dropped often enough
    published: list[str] = []
    finished = threading.Event()
    sessions: list[tuple[str, list[str]]] = []  # (cursor, ids received) of every reader, in any order
    errors: list[BaseException] = []
    churning: list[int] = []

    def read(api: Api, count: int | None) -> None:
        cursor = api.current_cursor()
        stream = SSE(live.url, api.auth, cursor=cursor)
        ids: list[str] = []
        try:
            assert stream.status == 200
            last = None
            last_frame_at = time.monotonic()
            while (len(ids) < count) if count is not None else last != total - 1:
                # Short polls, so a churner left short of its count leaves as soon as the publisher is done
                # (not 10 s later); "stuck" is still 10 s without a frame while events were flowing.
                try:
                    frame = stream.next_event(timeout=0.5)
                except TimeoutError:
                    if count is not None and finished.is_set():
                        break  # the publisher is done
                    if time.monotonic() - last_frame_at >= 10:  # events were still flowing: left unsubscribed?
                        raise AssertionError(f"reader for {count} events stuck after {len(ids)}") from None
                    continue
                last_frame_at = time.monotonic()
                if frame["data"]["channel"] == user.channel:
                    ids.append(frame["data"]["id"])
                    last = frame["data"]["data"]["n"]
        finally:
            stream.close()
            sessions.append((cursor, ids))

    def guarded(target, *args):
        try:
            target(*args)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)

    def churn(index: int) -> None:
        api = Api(live.url, email=user.email, device=f"churn-{index}")
        churning.append(index)
        while not finished.is_set():
            read(api, random.choice([0, 0, 1, 3]))

    def stay(after: int) -> None:
        api = Api(live.url, email=user.email, device=f"stay-{after}")
        wait_until(lambda: len(published) >= after or finished.is_set(), timeout=60, message="publishing")
        read(api, None)

    def drops() -> int:
        return own_redis.client().info("commandstats").get("cmdstat_unsubscribe", {}).get("calls", 0)

    # Three churners alone for most of the run, so the channel's reader count often falls to zero (until
    # it has been dropped ten times, and 30 readers have come and gone); then two readers join that stay
    # to the end.
    threads = [threading.Thread(target=guarded, args=(churn, i)) for i in range(3)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(churning) == 3, timeout=60, message="churners logged in")
    n = 0
    while n < 220 or drops() < 10 or len(sessions) < 30:
        assert n < 5000, "the channel was not dropped ten times, or fewer than 30 readers came and went"
        published.append(publisher.publish_ok({"n": n}))
        n += 1
    total = n + 160
    stayers = [threading.Thread(target=guarded, args=(stay, after)) for after in (n + 10, n + 40)]
    for thread in stayers:
        thread.start()
    for number in range(n, total):
        published.append(publisher.publish_ok({"n": number}))
    threads += stayers
    finished.set()
    for thread in threads:
        thread.join(60)
    assert not errors, errors

    redis_stats = own_redis.client().info("commandstats")
    assert redis_stats["cmdstat_unsubscribe"]["calls"] >= 10  # the channel really was dropped and taken again
    assert len(sessions) >= 30
    for cursor, ids in sessions:  # every reader, for as long as it stayed
        assert ids == ids_after(published, cursor, user.channel)[: len(ids)]
    to_the_end = [(cursor, ids) for cursor, ids in sessions if ids and ids[-1] == published[-1]]
    assert len(to_the_end) >= 2  # the two that stayed (and maybe churners that happened to be there)
    for cursor, ids in to_the_end:
        assert ids == ids_after(published, cursor, user.channel)


def _publish_or_none(user: Api, data) -> str | None:
    response = user.publish(data)
    return response.json()["id"] if response.status_code == 201 else None


def test_after_a_redis_restart_readers_channels_are_subscribed_again_and_nothing_is_lost(live, own_redis):
    redis_client = own_redis.client()
    alice, bob, carol = Api(live.url), Api(live.url), Api(live.url)
    streams = {user: connected(SSE(live.url, user.auth)) for user in (alice, bob)}
    gone = connected(SSE(live.url, carol.auth))
    gone.close()
    wait_until(lambda: subscribers(redis_client, carol.channel) == 0, message="carol's reader gone")
    published = {user: [user.publish_ok({"n": 0})] for user in (alice, bob)}

    own_redis.stop()
    own_redis.start()
    # Published as soon as Redis takes them, while the hub may still be reconnecting.
    for n in range(1, 11):
        for user in (alice, bob):
            published[user].append(wait_until(lambda u=user, n=n: _publish_or_none(u, {"n": n}), message="publish"))
    try:
        for user, stream in streams.items():
            frames = stream.events(len(published[user]), timeout=20)
            assert [f["data"]["id"] for f in frames] == published[user]
        assert subscribers(redis_client, alice.channel) == 1
        assert subscribers(redis_client, bob.channel) == 1
        assert subscribers(redis_client, carol.channel) == 0  # nobody reads it here any more
        assert hub_of(redis_client, live)["sub"] == "4"  # control, broadcast, Alice's and Bob's
        later = alice.publish_ok({"n": "later"})
        assert streams[alice].next_event()["data"]["id"] == later
    finally:
        for stream in streams.values():
            stream.close()


def test_a_subscription_redis_cannot_confirm_is_a_503_in_bounded_time(live, own_redis):
    """Redis at its client limit after the hub's connection dropped: the worker's pooled connections still
    work, but the hub cannot subscribe. A new stream gets a 503 after the hub's time-out, never a hang,
    and streams work again once the hub can reconnect."""
    redis_client = own_redis.client()
    user = Api(live.url)
    connected(SSE(live.url, user.auth)).close()  # the hub is up; the worker's pool has connections
    wait_until(lambda: subscribers(redis_client, user.channel) == 0, message="the first stream gone")
    # Room for every connection but the hub's, which is then closed.
    redis_client.config_set("maxclients", redis_client.info("clients")["connected_clients"] - 1)
    try:
        redis_client.client_kill_filter(_type="pubsub")
        assert user.poll().status_code == 204  # Redis itself still answers this worker (no events yet)
        started = time.monotonic()
        refused = SSE(live.url, user.auth)
        waited = time.monotonic() - started
        assert refused.status == 503 and json.loads(refused.body)["error"]["code"] == "unavailable"
        assert 4 < waited < 9  # the hub's 5 s bound once, not a quick failure elsewhere, not twice, not a hang
    finally:
        redis_client.config_set("maxclients", 10000)
    stream = wait_until(lambda: (s := SSE(live.url, user.auth)).status == 200 and s, message="hub back")
    try:
        event_id = user.publish_ok({"n": "back"})
        assert connected(stream).next_event()["data"]["id"] == event_id
    finally:
        stream.close()
