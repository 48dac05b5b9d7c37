"""Outgoing webhooks on a Redis Cluster, driven below HTTP: the store in this process, the real delivery
process (`worker.py`), and events published the way a cluster publisher does it (the event stored in its
channel's stream, then `feed_events` as a step of its own). Steps interrupted half-way are made by hand
(exactly the writes a process would have made before dying) and the delivery process must finish them.
The last test kills the primary that holds an endpoint's queue in the middle of a delivery."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
import redis

from app import create_app
from app.events.bus import Event
from app.outgoing.feed import SEEN_FOR, feed_events
from app.outgoing.replay import replay_events
from app.outgoing.replicas import NotReplicated
from app.outgoing.store import DISPATCH_GROUP, OutgoingStore, message_id
from app.redis import Keys
from tests.outgoing.conftest import CLUSTER_ONLY, FAST, channel
from tests.outgoing.receivers import DeliveryProcess, Receiver
from tests.servers import wait_until

pytestmark = CLUSTER_ONLY


@dataclass
class Direct:
    """The store over the cluster, a running delivery process and the receiver."""

    store: OutgoingStore
    client: redis.RedisCluster
    worker: DeliveryProcess
    receiver: Receiver

    def endpoint(self, path: str, channels: list[str], **how) -> tuple[str, str]:
        record, secret = self.store.create_endpoint(self.receiver.behave(path, **how), channels, None, None)
        return record["id"], secret

    def publish(self, channel_name: str, event: str = "order.paid", n: int = 1) -> Event:
        """What POST /events does on a cluster: the event into its stream, then the feed as a second step."""
        data, ts = json.dumps({"n": n}), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event_id = self.client.xadd(Keys.stream(channel_name), {"event": event, "data": data, "ts": ts})
        published = Event(event_id, channel_name, event, data, ts)
        feed_events(self.client, [published])
        return published

    def statuses(self, endpoint_id: str) -> list[str]:
        return sorted(m["status"] for m in self.store.messages(endpoint_id, None, 100))


@pytest.fixture(scope="module")
def direct(base_env, outgoing_redis, tmp_path_factory, receiver):
    logs = tmp_path_factory.mktemp("outgoing-cluster")
    env = {**base_env, **outgoing_redis.env(), **FAST, "PROMETHEUS_MULTIPROC_DIR": str(logs)}
    outgoing_redis.flushall()
    app = create_app(env)
    worker = DeliveryProcess(env, logs / "worker.log").start()
    yield Direct(app.extensions["outgoing_store"], app.extensions["redis"], worker, receiver)
    worker.kill()


def test_a_published_event_is_fed_dispatched_and_delivered_and_a_failure_is_retried(direct):
    orders = channel()
    endpoint_id, secret = direct.endpoint(f"/cl-ok/{orders}", [orders], fail_first=1)
    event = direct.publish(orders)
    first, second = direct.receiver.wait_for(f"/cl-ok/{orders}", 2)
    assert second.verify(secret)["id"] == event.id and first.headers["webhook-id"] == second.headers["webhook-id"]
    wait_until(lambda: direct.statuses(endpoint_id) == ["delivered"], message="delivered")
    (message,) = direct.store.messages(endpoint_id, None, 10)
    assert [a["status_code"] for a in message["attempts"]] == [500, 204]
    rows, feed = direct.store.backlog()
    assert (endpoint_id, 0, None) in rows and feed == 0


def test_events_are_fed_only_while_an_endpoint_exists(direct, outgoing_redis):
    direct.store.delete_endpoint(direct.endpoint("/cl-gone", ["x"])[0])
    for endpoint_id in direct.client.smembers(Keys.outgoing_endpoints()):
        direct.store.delete_endpoint(endpoint_id)
    before = direct.client.xinfo_stream(Keys.outgoing_feed())["entries-added"]
    time.sleep(SEEN_FOR + 0.1)  # nothing to await: the publisher's memory of having seen an endpoint lapses
    direct.publish(channel())
    assert direct.client.xinfo_stream(Keys.outgoing_feed())["entries-added"] == before
    orders = channel()
    endpoint_id, secret = direct.endpoint(f"/cl-fed/{orders}", [orders])  # once answered, events are fed
    event = direct.publish(orders)
    assert direct.client.xinfo_stream(Keys.outgoing_feed())["entries-added"] == before + 1
    assert direct.receiver.wait_for(f"/cl-fed/{orders}", 1)[0].verify(secret)["id"] == event.id


# KEYS: the feed. ARGV: group, consumer, then the entry's fields. An entry that one consumer has read.
READ_BY = """
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'STREAMS', KEYS[1], '>')
return id
"""


def test_a_dispatch_interrupted_before_its_acknowledgement_is_finished_once(direct):
    """A dispatcher that made an event's message and died before acknowledging the feed entry: the live
    delivery process claims the entry (no heartbeat) and dispatches it again, which makes nothing twice."""
    orders = channel()
    endpoint_id, secret = direct.endpoint(f"/cl-half/{orders}", [orders])
    feed, data = Keys.outgoing_feed(), json.dumps({"n": 1})
    event_id = direct.client.xadd(Keys.stream(orders), {"event": "order.paid", "data": data, "ts": "t"})
    fields = ["id", event_id, "channel", orders, "event", "order.paid", "data", data, "ts", "t"]
    direct.client.eval(READ_BY, 1, feed, DISPATCH_GROUP, "dead-dispatcher", *fields)
    body = Event(event_id, orders, "order.paid", data, "t").as_json()
    assert direct.store.enqueue(endpoint_id, [(event_id, orders, "order.paid", body)], force=False) == 1
    wait_until(lambda: not direct.client.xpending(feed, DISPATCH_GROUP)["pending"], message="the entry finished")
    (received,) = direct.receiver.wait_for(f"/cl-half/{orders}", 1)
    assert received.verify(secret)["id"] == event_id
    wait_until(lambda: direct.statuses(endpoint_id) == ["delivered"], message="delivered")
    assert direct.client.xinfo_stream(Keys.outgoing_queue(endpoint_id))["entries-added"] == 1  # queued once
    assert len(direct.receiver.at(f"/cl-half/{orders}")) == 1


def test_an_interrupted_deletion_counts_as_gone_and_is_pruned(direct):
    dangling = "ep_" + "d" * 32  # its record was deleted, its id not yet
    direct.client.sadd(Keys.outgoing_endpoints(), dangling)
    assert dangling not in {record["id"] for record in direct.store.list_endpoints()}
    direct.store.update_endpoint(direct.endpoint("/cl-bump", ["y"])[0], {"description": "bump"})
    wait_until(lambda: not direct.client.sismember(Keys.outgoing_endpoints(), dangling), message="pruned")


def test_manual_retry_and_replay_send_again_under_the_same_webhook_id(direct):
    orders = channel()
    endpoint_id, secret = direct.endpoint(f"/cl-again/{orders}", [orders])
    events = [direct.publish(orders, n=n) for n in range(3)]
    originals = direct.receiver.wait_for(f"/cl-again/{orders}", 3)
    ids = {r.verify(secret)["id"]: r.headers["webhook-id"] for r in originals}
    wait_until(lambda: direct.statuses(endpoint_id) == ["delivered"] * 3, message="delivered")
    record = direct.store.message_record(endpoint_id, message_id(endpoint_id, orders, events[0].id))
    assert direct.store.retry_message(endpoint_id, record) == 1
    retried = direct.receiver.wait_for(f"/cl-again/{orders}", 4)[3]
    assert retried.headers["webhook-id"] == ids[events[0].id]
    endpoint = direct.store.endpoint_record(endpoint_id)
    assert replay_events(direct.store, direct.client, endpoint, {orders: events[0].id}, None) == 2
    again = direct.receiver.wait_for(f"/cl-again/{orders}", 6)[4:]
    assert sorted(r.headers["webhook-id"] for r in again) == sorted(ids[e.id] for e in events[1:])


def test_retries_scheduled_by_an_earlier_version_move_into_their_endpoints_schedule(direct):
    endpoint_id, gone = direct.endpoint("/cl-legacy", ["z"])[0], "ep_" + "e" * 32
    msg = message_id(endpoint_id, "z", "1-0")
    due = round(time.time()) + 3600.5  # not yet: the running delivery process would release a due one at once
    direct.client.zadd(Keys.outgoing_legacy_retries(), {f"{endpoint_id}\n{msg}": due, f"{gone}\n{msg}": 1.0})
    direct.store.migrate_legacy_retries()  # (the delivery process also does, every 10 s: either may)
    assert direct.client.zscore(Keys.outgoing_retries(endpoint_id), msg) == due
    assert not direct.client.exists(Keys.outgoing_retries(gone))  # a deleted endpoint's retry is dropped
    assert not direct.client.exists(Keys.outgoing_legacy_retries())


def test_with_replicated_durability_feed_and_dispatch_wait_for_a_replica(direct, outgoing_redis):
    """EVENT_DURABILITY=replicated: a feed entry, and the messages made from it, count as written only once
    a replica has them. With the replica of their node stopped, both steps fail (and are repeated later,
    making nothing twice); with it back, both succeed."""
    cluster = outgoing_redis.server
    wait_until(cluster.whole, timeout=30, message="every primary with its replica")
    primary = cluster.primary_of(Keys.outgoing_feed())
    endpoint_id = None
    while endpoint_id is None:  # an endpoint whose keys live on the feed's node: one replica to stop
        path = f"/cl-replicated/{channel()}"
        candidate, secret = direct.endpoint(path, ["replicated"])
        if cluster.primary_of(Keys.outgoing_queue(candidate)) == primary:
            endpoint_id = candidate
        else:
            direct.store.delete_endpoint(candidate)
    store = OutgoingStore(direct.client, direct.store.settings, replicated=True)
    event = Event("1-1", "replicated", "order.paid", "{}", "t")
    item = (event.id, event.channel, event.event, event.as_json())
    replica = cluster.replica_of(primary)
    cluster.kill_node(replica)
    try:
        with pytest.raises(NotReplicated):
            feed_events(direct.client, [event], replicated=True)
        with pytest.raises(NotReplicated):
            store.dispatch({endpoint_id: [item]}, [])
        assert feed_events(direct.client, [event]) == 1  # the same steps, not waiting, succeed
    finally:
        cluster.start_node(replica)
    wait_until(cluster.whole, timeout=30, message="replica back")
    assert feed_events(direct.client, [event], replicated=True) == 1
    assert store.dispatch({endpoint_id: [item]}, []) == 0  # made by the failed attempt already: not twice
    (received,) = direct.receiver.wait_for(path, 1)
    assert received.verify(secret)["id"] == event.id


def test_a_failover_of_the_primary_holding_a_queue_mid_delivery_loses_no_replicated_message(direct, outgoing_redis):
    """Replication is asynchronous: what the primary acknowledged but had not yet sent to its replica is lost
    with it. This waits until the replica holds everything (its offset equals the primary's), then kills
    the primary with attempts in flight: the queue, its consumer group's pending entries and the messages
    survive on the promoted replica, and every message is delivered once the cluster is whole again."""
    cluster = outgoing_redis.server
    wait_until(cluster.whole, timeout=30, message="every primary with its replica")
    orders = channel()
    path = f"/cl-failover/{orders}"
    endpoint_id, secret = direct.endpoint(path, [orders], hang=True)
    events = [direct.publish(orders, n=n) for n in range(4)]
    held = direct.receiver.wait_for(path, 2)  # two attempts in flight (the per-endpoint bound), two queued
    primary = cluster.primary_of(Keys.outgoing_queue(endpoint_id))
    node = redis.Redis("127.0.0.1", primary, decode_responses=True)

    def replicated():
        info = node.info("replication")
        return info["connected_slaves"] and info["slave0"]["offset"] == info["master_repl_offset"]

    wait_until(replicated, message="the replica to hold every write")
    cluster.kill_node(primary)
    direct.receiver.behave(path)  # answers from now on
    started = time.monotonic()
    cluster.wait_for_failover(primary)
    received = direct.receiver.wait_for(path, 6, timeout=60)[2:]
    recovered = time.monotonic() - started
    assert sorted(r.verify(secret)["id"] for r in received) == sorted(e.id for e in events)
    assert {r.headers["webhook-id"] for r in held} <= {r.headers["webhook-id"] for r in received}
    wait_until(lambda: direct.statuses(endpoint_id) == ["delivered"] * 4, timeout=30, message="recorded")
    print(f"failover: every message delivered {recovered:.1f} s after the primary was killed")
    cluster.start_node(primary)  # back as a replica: the cluster is whole for whatever runs next
    wait_until(cluster.whole, timeout=30, message="cluster whole")
