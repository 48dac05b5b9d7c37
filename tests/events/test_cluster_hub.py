"""Live delivery on a Redis Cluster: each channel is SSUBSCRIBEd on the primary serving its slot (one hub
connection per primary read from), unsubscribed after its last reader; SPUBLISH reaches the reader;
replicated durability waits for the primary's replica; a batch over several slots."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from app.events.bus import CONTROL_CHANNEL, Bus, wake_channel
from app.redis import Keys, connect
from tests.events.clients import SSE, Api
from tests.events.conftest import start_on_cluster
from tests.servers import ROOT, LiveServer, RedisClusterServer, wait_until


@pytest.fixture(scope="module")
def cluster(own_cluster):
    return own_cluster


@pytest.fixture(scope="module")
def live(cluster, tmp_path_factory):
    """One worker (so counts of subscribers are exact), replicated durability."""
    server = start_on_cluster(cluster, tmp_path_factory, workers=1)
    yield server
    server.stop()


def node(port: int) -> redis.Redis:
    return redis.Redis("127.0.0.1", port, decode_responses=True)


def shard_subscribers(port: int, name: str) -> int:
    """Subscribers of the sharded channel `name` on one node."""
    return int(node(port).execute_command("PUBSUB", "SHARDNUMSUB", name)[1])


def hub_connections(cluster: RedisClusterServer, live: LiveServer) -> dict[int, dict]:
    """The worker's hub connections (named auth-rt-hub:<pid>), by the port of the node they are on."""
    (pid,) = live.worker_pids()
    found = {}
    for port in cluster.primaries():
        for client in node(port).client_list():
            if client["name"] == f"auth-rt-hub:{pid}":
                found[port] = client
    return found


def connected(stream: SSE) -> SSE:
    assert stream.status == 200
    stream.next(skip_comments=False)  # sent after subscribing and reading history
    return stream


def users_on_every_primary(cluster: RedisClusterServer, base: str) -> list[Api]:
    """Users whose channels, together, live on every primary."""
    users, ports = [], set()
    while len(ports) < 3:
        user = Api(base)
        port = cluster.primary_of(Keys.stream(user.channel))
        if port not in ports:
            ports.add(port)
            users.append(user)
    return users


def test_each_channel_is_subscribed_on_the_primary_of_its_slot_and_left_after_its_last_reader(cluster, live):
    users = users_on_every_primary(cluster, live.url)
    streams = [connected(SSE(live.url, user.auth)) for user in users]
    try:
        for user, stream in zip(users, streams, strict=True):  # the path delivers (SPUBLISH on the owner)
            event_id = user.publish_ok({"to": user.user_id})
            assert stream.next_event()["data"]["id"] == event_id
        primaries = cluster.primaries()
        for user in users:
            name, owner = wake_channel(user.channel), cluster.primary_of(Keys.stream(user.channel))
            assert {port: shard_subscribers(port, name) for port in primaries} == {
                port: int(port == owner) for port in primaries
            }
            assert node(owner).pubsub_numsub(name)[0][1] == 0  # sharded only, no plain SUBSCRIBE
        control_owner = cluster.primary_of(CONTROL_CHANNEL)
        assert shard_subscribers(control_owner, CONTROL_CHANNEL) == 1
        # One hub connection per primary, each holding only the channels of its slots (no pattern).
        hubs = hub_connections(cluster, live)
        assert sorted(hubs) == primaries
        for port, hub in hubs.items():
            here = [u for u in users if cluster.primary_of(Keys.stream(u.channel)) == port]
            expected = len(here) + (port == cluster.primary_of(wake_channel("broadcast"))) + (port == control_owner)
            assert (int(hub["ssub"]), int(hub["sub"]), int(hub["psub"])) == (expected, 0, 0)

        leaving, staying = users[0], users[1]
        streams[0].close()
        owner = cluster.primary_of(Keys.stream(leaving.channel))
        wait_until(lambda: shard_subscribers(owner, wake_channel(leaving.channel)) == 0, message="unsubscribed")
        staying_owner = cluster.primary_of(Keys.stream(staying.channel))
        assert shard_subscribers(staying_owner, wake_channel(staying.channel)) == 1
        assert shard_subscribers(control_owner, CONTROL_CHANNEL) == 1  # the control channel stays
        event_id = staying.publish_ok({"still": "here"})
        assert streams[1].next_event()["data"]["id"] == event_id
    finally:
        for stream in streams:
            stream.close()


def reading_replica(port: int) -> redis.Redis:
    """A connection to a replica that may read its keys (READONLY)."""
    replica = redis.Redis("127.0.0.1", port, decode_responses=True, single_connection_client=True)
    replica.execute_command("READONLY")
    return replica


def test_replicated_publications_wait_for_the_primarys_replica(cluster, live):
    user = Api(live.url)
    wait_until(cluster.whole, timeout=30, message="every primary with its replica")
    primary = cluster.primary_of(Keys.stream(user.channel))
    replica = reading_replica(cluster.replica_of(primary))
    event_id = user.publish_ok({"n": 1})
    # Answered only once the replica had it: no waiting here.
    assert [entry for entry, _ in replica.xrange(Keys.stream(user.channel))] == [event_id]

    replica_pid = int(replica.info("server")["process_id"])
    os.kill(replica_pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        refused = user.publish({"n": 2})
        waited = time.monotonic() - started
    finally:
        os.kill(replica_pid, signal.SIGCONT)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    assert 0.9 < waited < 5
    wait_until(cluster.whole, timeout=30, message="replica back")
    assert user.publish({"n": 3}).status_code == 201


def test_a_batch_over_several_slots_is_checked_whole_then_appended_slot_by_slot(cluster):
    client = connect(cluster.url, 8, "cluster")
    bus = Bus(client, None, 1000, "replicated")
    channels, ports = [], set()
    n = 0
    while len(ports) < 3:  # channels on every primary
        channel = f"batch-{n}"
        n += 1
        channels.append(channel)
        ports.add(cluster.primary_of(Keys.stream(channel)))
    events = [(channel, "e", {"i": i}) for i, channel in enumerate(channels * 2)]

    with pytest.raises(Exception, match="event name"):
        bus.publish_many([*events, (channels[0], "bad name!", {})])
    assert all(client.xlen(Keys.stream(channel)) == 0 for channel in channels)  # nothing written

    ids = bus.publish_many(events)
    for channel in channels:  # each channel's events, in batch order, with the ids answered
        entries = client.xrange(Keys.stream(channel))
        expected = [(ids[i], i) for i, (c, _, _) in enumerate(events) if c == channel]
        assert [(entry_id, int(fields["data"][5:-1])) for entry_id, fields in entries] == expected


def node_id(port: int) -> str:
    return node(port).execute_command("CLUSTER", "MYID")


def move_slot(cluster: RedisClusterServer, key: str, target: int) -> None:
    """Move `key`'s hash slot, with its keys, to the primary on `target` (as redis-cli --cluster reshard does)."""
    source = cluster.primary_of(key)
    slot = node(source).cluster("keyslot", key)
    node(target).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
    node(source).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
    while keys := node(source).execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        node(source).execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
    for port in cluster.primaries():
        node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(target))


def test_a_reader_follows_its_channel_when_the_slot_moves_to_another_primary(cluster, live):
    """Redis ends the SSUBSCRIBE of a channel whose slot leaves the node (an unasked `sunsubscribe`): the hub
    takes the channel on its new primary and the reader, resynchronised from the stream, misses nothing."""
    user = Api(live.url)
    stream = connected(SSE(live.url, user.auth))
    try:
        before = user.publish_ok({"n": 0})
        assert stream.next_event()["data"]["id"] == before
        name, source = wake_channel(user.channel), cluster.primary_of(Keys.stream(user.channel))
        target = next(port for port in cluster.primaries() if port != source)
        move_slot(cluster, Keys.stream(user.channel), target)
        wait_until(lambda: shard_subscribers(target, name) == 1, message="subscribed on the new primary")
        assert shard_subscribers(source, name) == 0
        published = [wait_until(lambda n=n: _published(user, n), message="publish") for n in range(1, 4)]
        assert [frame["data"]["id"] for frame in stream.events(3)] == published
    finally:
        stream.close()


def _published(user: Api, n: int) -> str | None:
    response = user.publish({"n": n})
    return response.json()["id"] if response.status_code == 201 else None


STALE_MAP_CHANNEL = "user:stale-map"


def subscribe_by_a_map_naming_a_replica(url: str, replica_port: str) -> None:
    """In a gevent-patched child, as in a worker: a hub whose slot map names the channel's replica as the primary of
    its slot (as a map from before a failover names the old primary, back as a replica) takes a reader."""
    from redis.cluster import PRIMARY, ClusterNode

    from app.events.hub import Hub
    from app.events.links import Cluster

    client = connect(url, 8, "cluster")
    slot = client.keyslot(wake_channel(STALE_MAP_CHANNEL))
    client.nodes_manager.slots_cache[slot] = [ClusterNode("127.0.0.1", int(replica_port), PRIMARY)]
    Hub(Cluster(client, url)).subscribe([STALE_MAP_CHANNEL], "u", "s", 100)  # returns once Redis confirmed it
    print("subscribed", flush=True)


def test_a_channel_is_never_subscribed_on_a_node_that_is_a_replica_now(cluster):
    """A replica confirms SSUBSCRIBE for its primary's slots, but a node just back as a replica may not pass on what
    the primary publishes: readers confirmed there took the next event live and stepped over those in between (the
    failover drill lost acknowledged events so). The link asks the node's role and goes to the slot's primary."""
    name = wake_channel(STALE_MAP_CHANNEL)
    primary = cluster.primary_of(name)
    replica = cluster.replica_of(primary)
    code = "from gevent import monkey; monkey.patch_all()\nimport sys\n"
    code += "from tests.events.test_cluster_hub import subscribe_by_a_map_naming_a_replica as run\n"
    child = subprocess.Popen(
        [sys.executable, "-c", code + "run(*sys.argv[1:])\nsys.stdin.read()", cluster.url, str(replica)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "subscribed", child.stderr.read()[-3000:]
        assert (shard_subscribers(primary, name), shard_subscribers(replica, name)) == (1, 0)
    finally:
        child.kill()
        child.wait(10)


def test_where_role_is_not_permitted_a_node_is_taken_as_the_slot_map_names_it(cluster):
    """An ACL without ROLE (`-@dangerous`) must not keep every link from connecting: the check is skipped there (as
    where ROLE is renamed away, also an error reply)."""
    from app.events.links import Cluster

    port = cluster.primaries()[0]
    rules = {"keys": ["*"], "channels": ["*"], "commands": ["+@all", "-role"]}
    node(port).acl_setuser("no-role", enabled=True, passwords=["+pw"], **rules)
    try:
        refused = redis.Connection("127.0.0.1", port, username="no-role", password="pw")
        refused.send_command("ROLE")
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused.read_response()
        topology = Cluster(cluster.client(), cluster.url)
        topology.check_node(redis.Connection("127.0.0.1", port, username="no-role", password="pw"))
        topology.check_node(redis.Connection("127.0.0.1", port))  # a primary, asked with ROLE
        with pytest.raises(redis.exceptions.ResponseError):  # a replica, asked with ROLE (what the hub acts on)
            topology.check_node(redis.Connection("127.0.0.1", cluster.replica_of(port)))
    finally:
        node(port).acl_deluser("no-role")
