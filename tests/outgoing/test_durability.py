"""At least once, and isolation: nothing is lost when a delivery process or gunicorn worker is SIGKILLed or
Redis restarts from its append-only file; a slow endpoint never delays a healthy one."""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from app.redis import Keys
from tests.outgoing.conftest import ON_BOTH, channel, not_on_cluster
from tests.outgoing.receivers import DeliveryProcess
from tests.servers import RedisServer, wait_until

pytestmark = ON_BOTH


@pytest.fixture(scope="module", autouse=True)
def killed_in_flight(service) -> dict:
    """A message in flight when its delivery process is SIGKILLed, and a successor process started: set going
    before the module's first test, as the successor takes the message over only after its next look for dead
    processes' entries (a second apart), which the next tests' time covers. Its test checks the takeover; an
    error here is raised there. The successor is the module service's delivery process from then on."""
    try:
        receiver, api = service.receiver, service.admin
        orders = channel()
        path = f"/killed/{orders}"
        endpoint = api.create_endpoint(receiver.behave(path, hang=True), [orders])
        event_id = api.publish(orders)
        (first,) = receiver.wait_for(path, 1)  # the attempt is in flight: the receiver holds it
        service.workers[0].kill()  # SIGKILL: the entry is never acknowledged
        service.workers[0].heartbeat_lapses_now()  # as it would 5 s later
        receiver.behave(path)  # the receiver answers from now on
        successor = DeliveryProcess(service.env, service.workers[0].log_path.with_name("successor.log")).start()
        service.workers.append(successor)
    except Exception as error:  # noqa: BLE001 - raised again in the scenario's own test
        return {"error": error}
    return {"error": None, "path": path, "endpoint": endpoint, "event_id": event_id, "first": first}


def test_killed_gunicorn_workers_lose_no_published_event(service):
    """The dispatcher's feed has an event before POST /events answers (on one Redis in the same atomic step,
    on a cluster as the next step): once answered, the message is on its way whatever happens to the web
    worker. First in the module: gunicorn's new workers finish booting during the next tests (a worker
    still booting when the module's server is stopped ignores the quit and is killed 10 s later)."""
    receiver, api = service.receiver, service.admin
    orders = channel()
    path = f"/web-killed/{orders}"
    endpoint = api.create_endpoint(receiver.behave(path), [orders])
    ids = [api.publish(orders, data={"n": n}) for n in range(20)]
    for pid in service.web.worker_pids():
        os.kill(pid, signal.SIGKILL)
    received = receiver.wait_for(path, 20)
    assert sorted(r.verify(endpoint["secret"])["id"] for r in received) == sorted(ids)


def test_a_message_in_flight_when_its_delivery_process_is_killed_is_sent_again(service, killed_in_flight):
    receiver, api = service.receiver, service.admin
    if killed_in_flight["error"] is not None:
        raise killed_in_flight["error"]
    path, endpoint, first = killed_in_flight["path"], killed_in_flight["endpoint"], killed_in_flight["first"]
    event_id = killed_in_flight["event_id"]
    # The successor claims the dead process's entry once its heartbeat has lapsed.
    second = receiver.wait_for(path, 2, timeout=20)[1]
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    assert second.verify(endpoint["secret"])["id"] == event_id
    delivered = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    assert [a["status_code"] for a in delivered["attempts"]] == [204]


@not_on_cluster("the sender's isolation, not the store")
def test_a_never_answering_endpoint_does_not_delay_a_healthy_one(service):
    receiver, api = service.receiver, service.admin
    orders = channel()
    stuck = api.create_endpoint(receiver.behave(f"/stuck/{orders}", hang=True), [orders])
    healthy = api.create_endpoint(receiver.behave(f"/healthy/{orders}"), [orders])
    published = {}
    for n in range(20):
        published[api.publish(orders, data={"n": n})] = time.time()
        time.sleep(0.02)
    received = receiver.wait_for(f"/healthy/{orders}", 20, timeout=10)
    delays = [r.at - published[r.verify(healthy["secret"])["id"]] for r in received]
    # The stuck endpoint holds every request for the whole time-out (2 s here), two at a time (the
    # per-endpoint bound), with its other messages waiting...
    assert len(receiver.at(f"/stuck/{orders}")) == 2
    # ...while each healthy message arrives at once.
    assert max(delays) < 1.0, delays
    # Its held messages would keep the module's delivery processes' requests to it busy for a minute more.
    assert api.call("DELETE", f"/admin/webhook-endpoints/{stuck['id']}").status_code == 204


@not_on_cluster("claiming on the cluster: the killed-process test and test_cluster.py")
def test_two_delivery_processes_share_the_work_and_one_takes_over_from_the_other(service, outgoing_redis):
    # The module's service, with a second live delivery process (the first was killed and succeeded by now).
    while len(live := [w for w in service.workers if w.process.poll() is None]) < 2:
        log_path = service.workers[0].log_path.with_name(f"worker-{len(service.workers)}.log")
        service.workers.append(DeliveryProcess(service.env, log_path).start())
    receiver, api = service.receiver, service.admin
    orders = channel()
    shared = api.create_endpoint(receiver.behave(f"/shared/{orders}", delay=0.05), [orders])
    ids = [api.publish(orders, data={"n": n}) for n in range(30)]
    received = receiver.wait_for(f"/shared/{orders}", 30)
    assert sorted(r.verify(shared["secret"])["id"] for r in received) == sorted(ids)  # each once: no duplicate
    wait_until(lambda: len(api.messages(shared["id"], "delivered")) == 30, message="every outcome recorded")

    path = f"/owner-killed/{orders}"
    held = api.create_endpoint(receiver.behave(path, hang=True), [channel_two := channel()])
    api.publish(channel_two)
    (first,) = receiver.wait_for(path, 1)
    (pending,) = outgoing_redis.client().xpending_range(Keys.outgoing_queue(held["id"]), "deliver", "-", "+", 10)
    owner = next(w for w in live if f"-{w.process.pid}-" in pending["consumer"])
    owner.kill()
    owner.heartbeat_lapses_now()  # as it would 5 s later
    receiver.behave(path)
    # The other, live process sees the owner's heartbeat lapse and claims its entry.
    second = receiver.wait_for(path, 2, timeout=20)[1]
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    second.verify(held["secret"])
    assert len(receiver.at(f"/shared/{orders}")) == 30  # what was acknowledged is not sent again


@not_on_cluster("one redis-server's file; a cluster's failover is test_cluster.py's")
def test_nothing_is_lost_when_redis_restarts_from_its_append_only_file(make_service, tmp_path):
    """One redis-server restarting from its file (a cluster's failover: test_cluster.py)."""
    persistent = RedisServer(tmp_path, persistent=True)
    persistent.start()
    try:
        service = make_service(REDIS_URL=persistent.url)
        receiver, api = service.receiver, service.admin
        orders = channel()
        path = f"/redis-restart/{orders}"
        # Every message's first attempt fails, so they wait in the retry set; later ones are in flight.
        endpoint = api.create_endpoint(receiver.behave(path, fail_first=5, delay=0.3), [orders])
        before = [api.publish(orders, data={"n": n}) for n in range(5)]
        receiver.wait_for(path, 5)
        persistent.process.kill()  # SIGKILL: only what the append-only file holds survives
        persistent.process.wait(10)
        persistent.start()
        wait_until(lambda: requests_ok(service.web.url + "/readyz"), timeout=15, message="service ready again")
        after = [api.publish(orders, data={"n": n}) for n in range(5, 10)]
        received = receiver.wait_for(path, 15, timeout=30)
        delivered = {r.verify(endpoint["secret"])["id"] for r in received[5:]}
        assert delivered == set(before + after)
        done = wait_until(
            lambda: len(m := api.messages(endpoint["id"], "delivered")) == 10 and m, timeout=15, message="recorded"
        )
        assert {m["event_id"] for m in done} == set(before + after)
    finally:
        persistent.stop()


def requests_ok(url: str) -> bool:
    return requests.get(url, timeout=2).ok
