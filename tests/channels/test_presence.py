"""Presence (app/channels/presence.py): counting a user's connections across keepers (workers), join and
leave exactly once per change of the user, leases that outlive a crashed worker by less than the timeout,
snapshots, and the join and leave events as ordinary events of the channel.

These keepers have no linger (PRESENCE_LINGER_SECONDS=0: each leave at once), as before it existed; the
linger has its tests in test_presence_linger.py.

Against the session's Redis in both modes. The keepers of this process run their renewer and reaper as
greenlets, which run while a test yields to gevent (`pump`); the test process is not monkey-patched, so
"many greenlets at once" and "a worker killed" run in a child process that is (`run_worker`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import gevent
import pytest
import redis

from app.channels.presence import PresenceKeeper, init_app
from app.events.bus import Bus
from app.redis import Keys
from tests.servers import ROOT, RedisServer, process_env, wait_until

CHANNEL = "room:lobby"
TS_PATTERN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# For tests that watch leases run out. A lease lasts 0.6 of the timeout and is renewed every 0.2 of it, so
# a held entry lapses if this process stalls for 0.4 of it: 1.2 s here, which a busy machine did not reach
# (at 1 s, a stall of 0.4 s let this process's own reaper drop its renewer's entries).
SHORT_TIMEOUT = 3.0


def pump(predicate, timeout: float = 10.0, message: str = "condition"):
    """wait_until, giving this process's greenlets (the keepers' renewers and reapers) their turns."""
    return wait_until(lambda: gevent.sleep(0.01) or predicate(), timeout=timeout, message=message)


def run_for(seconds: float) -> None:
    """Let the greenlets run for a while: for checks that something lasts, not to wait for an event."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        gevent.sleep(0.01)


def history(rdb, channel: str = CHANNEL) -> list[tuple[str, str, dict, str]]:
    """The channel's stream: (id, event, data, ts) in order."""
    return [(i, f["event"], json.loads(f["data"]), f["ts"]) for i, f in rdb.xrange(Keys.stream(channel))]


def changes(rdb, channel: str = CHANNEL) -> list[tuple[str, str]]:
    """The presence events of the channel, in order: (event, user id)."""
    return [(event, data["user_id"]) for _, event, data, _ in history(rdb, channel) if event.startswith("presence.")]


def present(snapshot: dict) -> dict[str, int]:
    """user id -> connections, from a snapshot."""
    return {user["user_id"]: user["connections"] for user in snapshot["users"]}


def grant(rdb, user_id: str, info, expires_at=None, channel: str = CHANNEL, compact: bool = True) -> None:
    """A members-hash entry as the grants module writes it (or with JSON's default spacing)."""
    separators = (",", ":") if compact else None
    rdb.hset(Keys.channel_members(channel), user_id, json.dumps({"info": info, "expires_at": expires_at},
                                                                 separators=separators))  # fmt: skip


class WakeListener:
    """The channel's wake-up messages, as the event hub receives them (sharded pub/sub on a cluster)."""

    def __init__(self, rdb, channel: str = CHANNEL):
        self.cluster = isinstance(rdb, redis.RedisCluster)
        self.pubsub = rdb.pubsub()
        name = f"wake:{{{channel}}}"
        if self.cluster:
            self.pubsub.ssubscribe(name)
        else:
            self.pubsub.subscribe(name)
        self.received: list[dict] = []
        wait_until(lambda: self._read() == "confirmed", message="the wake-up subscription")

    def _read(self):
        if self.cluster:
            message = self.pubsub.get_sharded_message(timeout=0.05)
        else:
            message = self.pubsub.get_message(timeout=0.05)
        if message is None:
            return None
        if message["type"] in ("subscribe", "ssubscribe"):
            return "confirmed"
        self.received.append(json.loads(message["data"]))
        return "message"

    def until(self, count: int) -> list[dict]:
        wait_until(lambda: self._read() and len(self.received) >= count, message=f"{count} wake-up messages")
        return self.received

    def close(self) -> None:
        self.pubsub.close()


def test_counts_each_users_connections_across_keepers(keepers, rdb):
    workers = [keepers(), keepers(), keepers()]
    ann = [workers[0].enter(CHANNEL, "ann", True), workers[0].enter(CHANNEL, "ann", True)]
    ann.append(workers[1].enter(CHANNEL, "ann", True))
    bob = workers[2].enter(CHANNEL, "bob", True)
    assert workers[1].snapshot(CHANNEL) == {
        "channel": CHANNEL,
        "count": 2,
        "users": [
            {"user_id": "ann", "info": None, "connections": 3},
            {"user_id": "bob", "info": None, "connections": 1},
        ],
    }
    assert changes(rdb) == [("presence.join", "ann"), ("presence.join", "bob")]

    workers[0].leave(ann[0])
    workers[1].leave(ann[2])
    assert present(workers[2].snapshot(CHANNEL)) == {"ann": 1, "bob": 1}
    assert len(changes(rdb)) == 2, "no leave while one of ann's connections stays"
    workers[0].leave(ann[1])
    workers[0].leave(ann[1])  # a second leave of one entry changes nothing
    assert present(workers[0].snapshot(CHANNEL)) == {"bob": 1}
    workers[2].leave(bob)
    assert workers[0].snapshot(CHANNEL) == {"channel": CHANNEL, "count": 0, "users": []}
    assert changes(rdb) == [
        ("presence.join", "ann"),
        ("presence.join", "bob"),
        ("presence.leave", "ann"),
        ("presence.leave", "bob"),
    ]
    assert rdb.exists(Keys.presence(CHANNEL), Keys.presence_users(CHANNEL), Keys.presence_sorted(CHANNEL)) == 0


def test_without_join_leave_users_count_but_nothing_is_published(keepers, rdb):
    keeper = keepers()
    entry = keeper.enter(CHANNEL, "ann", False)
    assert present(keeper.snapshot(CHANNEL)) == {"ann": 1}
    keeper.leave(entry)
    assert keeper.snapshot(CHANNEL)["count"] == 0
    keeper.leave(keeper.enter(CHANNEL, "bob", True))  # proves this channel's events are seen
    assert changes(rdb) == [("presence.join", "bob"), ("presence.leave", "bob")]


def test_join_and_leave_are_events_of_the_channel_in_order_and_on_the_wire(keepers, rdb):
    rdb.sadd(Keys.outgoing_endpoints(), "endpoint-1")  # an outgoing endpoint exists: events are fed
    bus = Bus(rdb, None, history_maxlen=1000)
    listener = WakeListener(rdb)
    try:
        keeper = keepers()
        bus.publish(CHANNEL, "message", {"n": 1})
        entry = keeper.enter(CHANNEL, "ann", True)
        bus.publish(CHANNEL, "message", {"n": 2})
        keeper.leave(entry)
        bus.publish(CHANNEL, "message", {"n": 3})
        wire = listener.until(5)
    finally:
        listener.close()

    stored = history(rdb)
    assert [(event, data) for _, event, data, _ in stored] == [
        ("message", {"n": 1}),
        ("presence.join", {"user_id": "ann", "info": None}),
        ("message", {"n": 2}),
        ("presence.leave", {"user_id": "ann", "info": None}),
        ("message", {"n": 3}),
    ]
    assert [message["id"] for message in wire] == [event_id for event_id, *_ in stored]
    for message, (_, event, data, ts) in zip(wire, stored, strict=True):
        assert set(message) == {"id", "channel", "event", "data", "ts"}
        assert message["channel"] == CHANNEL and message["event"] == event and message["ts"] == ts
        assert isinstance(message["data"], str) and json.loads(message["data"]) == data  # JSON text, as the bus
        assert TS_PATTERN.match(ts)
    fed = [(f["id"], f["channel"], f["event"], json.loads(f["data"])) for _, f in rdb.xrange(Keys.outgoing_feed())]
    assert fed == [(event_id, CHANNEL, event, data) for event_id, event, data, _ in stored]


def test_join_and_leave_keep_the_channels_history_alive_as_publications_do(keepers, rdb):
    """A channel only presence writes to expires EVENT_HISTORY_TTL_SECONDS after its last join or leave."""
    keeper = keepers(history_ttl=100)
    entry = keeper.enter(CHANNEL, "ann", True)
    assert 90_000 < rdb.pttl(Keys.stream(CHANNEL)) <= 100_000
    rdb.pexpire(Keys.stream(CHANNEL), 50_000)
    keeper.leave(entry)
    assert 90_000 < rdb.pttl(Keys.stream(CHANNEL)) <= 100_000, "the leave renews it"


def test_info_comes_from_the_users_grant_in_force(keepers, rdb):
    info = {"name": "Ann Ö", "tags": [], "nested": {"list": [1, [2, {}]], "quote": 'a"b\\c'}, "big": 12345678901234567}
    grant(rdb, "ann", info)
    grant(rdb, "bob", {"name": "Bob"}, compact=False)
    grant(rdb, "cy", {"name": "Cy"}, expires_at=time.time() - 1)  # expired: as no grant
    grant(rdb, "dee", None)
    keeper = keepers()
    entries = {user: keeper.enter(CHANNEL, user, True) for user in ("ann", "bob", "cy", "dee", "eve")}

    joined = {data["user_id"]: data["info"] for _, event, data, _ in history(rdb) if event == "presence.join"}
    assert joined == {"ann": info, "bob": {"name": "Bob"}, "cy": None, "dee": None, "eve": None}
    raw = {json.loads(f["data"])["user_id"]: f["data"] for _, f in rdb.xrange(Keys.stream(CHANNEL))}
    assert '"tags":[]' in raw["ann"] and "12345678901234567" in raw["ann"], "info is passed on as it was granted"
    snapshot = keeper.snapshot(CHANNEL)
    assert {user["user_id"]: user["info"] for user in snapshot["users"]} == joined

    rdb.hdel(Keys.channel_members(CHANNEL), "ann")  # revoked before leaving: the leave has no info
    keeper.leave(entries["ann"])
    keeper.leave(entries["bob"])
    left = [data for _, event, data, _ in history(rdb) if event == "presence.leave"]
    assert left == [{"user_id": "ann", "info": None}, {"user_id": "bob", "info": {"name": "Bob"}}]


def test_snapshot_lists_the_first_1000_users_by_id_and_counts_them_all(keepers, rdb):
    keeper = keepers()
    users = [f"user-{(i * 7919) % 1005:04d}" for i in range(1005)]  # entered out of order
    for user in users:
        keeper.enter(CHANNEL, user, False)
    keeper.enter(CHANNEL, "user-0003", False)
    keeper.enter(CHANNEL, "user-0003", False)

    snapshot = keeper.snapshot(CHANNEL)
    assert snapshot["count"] == 1005
    assert [user["user_id"] for user in snapshot["users"]] == sorted(users)[:1000]
    assert present(snapshot)["user-0003"] == 3 and present(snapshot)["user-0004"] == 1
    small = keeper.snapshot(CHANNEL, limit=3)
    assert small["count"] == 1005 and [u["user_id"] for u in small["users"]] == ["user-0000", "user-0001", "user-0002"]
    assert keeper.snapshot("room:empty") == {"channel": "room:empty", "count": 0, "users": []}


def test_held_entries_are_renewed_and_an_emptied_channel_leaves_the_index(keepers, rdb):
    keeper = keepers(timeout=SHORT_TIMEOUT)
    entry = keeper.enter(CHANNEL, "ann", True)
    other = keepers(timeout=SHORT_TIMEOUT)
    other.snapshot(CHANNEL)  # a second reaper at work too
    run_for(1.2 * SHORT_TIMEOUT)  # twice a lease: renewed, never reaped
    assert present(other.snapshot(CHANNEL)) == {"ann": 1}
    assert changes(rdb) == [("presence.join", "ann")]
    assert rdb.zscore(Keys.presence_channels(), CHANNEL) is not None

    keeper.leave(entry)
    pump(lambda: rdb.zscore(Keys.presence_channels(), CHANNEL) is None, message="the reaper to drop the channel")
    assert changes(rdb) == [("presence.join", "ann"), ("presence.leave", "ann")]


# Child processes: a monkey-patched gevent process, as a gunicorn worker is, with keepers of its own.
WORKER = r"""
from gevent import monkey
monkey.patch_all()
import json, random, sys
import gevent
from app.channels.presence import PresenceKeeper
from app.redis import connect

url, mode, action, channel, timeout, arg, linger = sys.argv[1:8]
keepers = [PresenceKeeper(connect(url, 16, mode), float(timeout), linger_seconds=float(linger)) for _ in range(3)]
if action == "churn":
    rng = random.Random(int(arg))
    users = [f"u{i}" for i in range(10)]

    def churn():
        for _ in range(20):
            gevent.sleep(rng.random() * 0.004)
            keeper = rng.choice(keepers)
            entry = keeper.enter(channel, rng.choice(users), True)
            gevent.sleep(rng.random() * 0.004)
            keeper.leave(entry)

    gevent.joinall([gevent.spawn(churn) for _ in range(30)], raise_error=True)
    print(json.dumps({"enters": 30 * 20, "snapshot": keepers[0].snapshot(channel)}), flush=True)
else:  # hold: enter the users, say so, and keep them until killed; leave: the first of them leaves first
    entries = [keepers[0].enter(channel, user, True) for user in arg.split(",")]
    if action == "leave":
        keepers[0].leave(entries[0])
    print("ready", flush=True)
    gevent.sleep(3600)
"""


def run_worker(redis_server, action: str, timeout: float, arg: str, linger: float = 0.0) -> subprocess.Popen:
    """A child process running WORKER against the session's Redis."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            WORKER,
            redis_server.url,
            redis_server.mode,
            action,
            CHANNEL,
            str(timeout),
            arg,
            str(linger),
        ],
        cwd=ROOT,
        env=process_env(PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_many_greenlets_entering_and_leaving_publish_each_change_once(rdb, redis_server):
    worker = run_worker(redis_server, "churn", 60, "29")
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0
    report = json.loads(output)
    assert report["snapshot"] == {"channel": CHANNEL, "count": 0, "users": []}

    seen = changes(rdb)
    joins = [user for event, user in seen if event == "presence.join"]
    assert 0 < len(joins) < report["enters"], "connections of one user overlapped, and joined once"
    for user in {user for _, user in seen}:
        events = [event for event, who in seen if who == user]
        assert events == ["presence.join", "presence.leave"] * (len(events) // 2), f"{user}: {events}"
    assert rdb.exists(Keys.presence(CHANNEL), Keys.presence_users(CHANNEL), Keys.presence_sorted(CHANNEL)) == 0


@pytest.mark.slow
def test_a_killed_workers_users_leave_within_the_timeout(keepers, rdb, redis_server):
    timeout = SHORT_TIMEOUT
    worker = run_worker(redis_server, "hold", timeout, "ann,bob")
    try:
        assert worker.stdout.readline().strip() == "ready"
        keeper = keepers(timeout=timeout)
        for _ in range(2):
            keepers(timeout=timeout).start()  # more reapers, as in other workers: ann leaves once
        keeper.enter(CHANNEL, "bob", True)  # bob is also here: he stays
        keeper.enter(CHANNEL, "cy", True)
        assert present(keeper.snapshot(CHANNEL)) == {"ann": 1, "bob": 2, "cy": 1}
        run_for(timeout)  # the worker has been renewing its leases meanwhile
        assert ("presence.leave", "ann") not in changes(rdb)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        killed = time.monotonic()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        worker.stdout.close()

    pump(lambda: ("presence.leave", "ann") in changes(rdb), timeout=10, message="ann's leave")
    assert time.monotonic() - killed < timeout
    assert present(keeper.snapshot(CHANNEL)) == {"bob": 1, "cy": 1}
    run_for(timeout)  # over a lease: bob and cy are renewed, not reaped
    assert present(keeper.snapshot(CHANNEL)) == {"bob": 1, "cy": 1}
    assert changes(rdb) == [
        ("presence.join", "ann"),
        ("presence.join", "bob"),
        ("presence.join", "cy"),
        ("presence.leave", "ann"),
    ]


@pytest.mark.slow
def test_an_outage_is_logged_once_and_held_entries_come_back(tmp_path, caplog):
    server = RedisServer(tmp_path)  # a Redis of this test's own: it is stopped and started again
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True, socket_connect_timeout=0.5)
    keeper = PresenceKeeper(client, 1.0, redis_url=server.url)
    try:
        kept = keeper.enter(CHANNEL, "ann", True)
        dropped = keeper.enter(CHANNEL, "bob", True)
        caplog.set_level(logging.INFO, logger="app.channels.presence")
        server.stop()
        with pytest.raises(redis.exceptions.ConnectionError):
            keeper.enter(CHANNEL, "cy", True)
        keeper.leave(dropped)  # never raises

        def failures() -> list[str]:
            return [r.getMessage() for r in caplog.records if "cannot reach redis" in r.getMessage()]

        said = ["presence: leaving", "presence: reaping lapsed leases", "presence: renewing leases"]
        pump(lambda: {m.split(" cannot reach")[0] for m in failures()} == set(said), message="each failure logged")
        run_for(1.5)  # several more renewals and reaper passes fail meanwhile, and none of them is logged again
        assert sorted(m.split(" cannot reach")[0] for m in failures()) == said
        assert all(f"at 127.0.0.1:{server.port} (REDIS_URL) (" in m for m in failures()), failures()

        server.start()  # empty: the renewer enters its entries again, and says the outage is over
        pump(lambda: present(keeper.snapshot(CHANNEL)) == {"ann": 1}, message="ann entered again")
        assert [(e, d["user_id"]) for _, e, d, _ in history(client)] == [("presence.join", "ann")]
        pump(lambda: any("renewing leases reaches redis at" in r.getMessage() for r in caplog.records))
        keeper.leave(kept)
        assert keeper.snapshot(CHANNEL)["count"] == 0
    finally:
        keeper.stop()
        server.stop()


def test_init_app_binds_a_keeper_with_the_settings(make_app):
    app = make_app(PRESENCE_TIMEOUT_SECONDS=2, EVENT_HISTORY_MAXLEN=50, PRESENCE_LINGER_SECONDS=0.25)
    init_app(app)
    keeper = app.extensions["presence"]
    assert isinstance(keeper, PresenceKeeper)
    assert (keeper.client, keeper.timeout, keeper.history_maxlen) == (app.extensions["redis"], 2, 50)
    assert keeper.history_ttl_ms == 7 * 24 * 3600 * 1000
    assert (keeper.linger, keeper.linger_ms) == (0.25, 250)
    assert make_app().extensions["presence"].linger == 2, "two seconds unless configured"
    with app.test_request_context():
        app.preprocess_request()  # not a gevent worker: nothing is started in this process
    assert keeper._reaper is None
