"""EVENT_DURABILITY=replicated on one Redis with a replica: a publication is answered only once the
replica has it (WAIT on the connection that ran the publish script), and 503 in bounded time when no
replica confirms."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from app.redis import Keys
from tests.events.clients import SSE, Api, open_ws, ws_json
from tests.events.conftest import own_redis_env
from tests.servers import LiveServer, RedisServer, wait_until


@pytest.fixture(scope="module")
def primary_and_replica(tmp_path_factory):
    primary, replica = (RedisServer(tmp_path_factory.mktemp(name)) for name in ("primary", "replica"))
    primary.start()
    replica.start()
    primary.client().config_set("repl-diskless-sync-delay", 0)  # sync at once, not after 5 s
    replica.client().replicaof("127.0.0.1", primary.port)
    wait_until(lambda: replica.client().info("replication")["master_link_status"] == "up", message="replica in sync")
    yield primary, replica
    replica.stop()
    primary.stop()


@pytest.fixture(scope="module")
def replicated(primary_and_replica, tmp_path_factory):
    primary, _ = primary_and_replica
    env = own_redis_env(tmp_path_factory.mktemp("var"), REDIS_URL=primary.url, EVENT_DURABILITY="replicated")
    live = LiveServer(env, workers=1, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


class Stopped:
    """A redis-server process frozen with SIGSTOP (it keeps its connections, answers nothing) until exit."""

    def __init__(self, server: RedisServer):
        self.pid = server.process.pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def on_replica(replica: RedisServer, channel: str) -> list[str]:
    return [entry_id for entry_id, _ in replica.client().xrange(Keys.stream(channel))]


def test_a_publication_is_answered_only_once_the_replica_has_it(replicated, primary_and_replica):
    _, replica = primary_and_replica
    user = Api(replicated.url)
    answers: list = []
    with Stopped(replica):
        publishing = threading.Thread(target=lambda: answers.append(user.publish({"n": 1})))
        publishing.start()
        publishing.join(0.4)
        assert publishing.is_alive() and not answers  # held while the replica cannot confirm
    publishing.join(5)
    assert answers[0].status_code == 201, answers[0].text
    # At the moment of the 201 the replica already holds the event: no waiting here.
    assert on_replica(replica, user.channel) == [answers[0].json()["id"]]

    ids = user.http.post(
        f"{replicated.url}/events/batch",
        json={"events": [{"channel": user.channel, "event": "b", "data": n} for n in range(3)]},
        headers=user.auth,
    ).json()["ids"]
    assert on_replica(replica, user.channel)[-3:] == ids


def test_without_a_replica_confirming_a_publication_is_a_503_in_bounded_time(replicated, primary_and_replica):
    _, replica = primary_and_replica
    user = Api(replicated.url)
    stream = SSE(replicated.url, user.auth)
    ws = open_ws(replicated.url, user.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        stream.next(skip_comments=False)
        with Stopped(replica):
            started = time.monotonic()
            refused = user.publish({"n": "unconfirmed"})
            waited = time.monotonic() - started
            batch = user.http.post(
                f"{replicated.url}/events/batch",
                json={"events": [{"channel": user.channel, "event": "b", "data": 1}]},
                headers=user.auth,
            )
            ws.send(json.dumps({"type": "publish", "event": "w", "data": 1}))
            frame = ws_json(ws)
            while frame["type"] == "event":  # the live copies of what was just published (not confirmed)
                frame = ws_json(ws)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "unavailable"
        assert 0.9 < waited < 5  # the replica's 1 s to confirm, then the answer: never a hang
        assert batch.status_code == 503 and batch.json()["error"]["code"] == "unavailable"
        assert frame == {"type": "error", "code": "unavailable", "message": frame["message"]}
        # At least once: an unconfirmed event may still be delivered (here it is stored on the primary).
        delivered = [stream.next_event()["data"]["data"] for _ in range(3)]
        assert delivered[0] == {"n": "unconfirmed"}
        # Once the replica answers again, publications are confirmed again.
        wait_until(lambda: replica.client().info("replication")["master_link_status"] == "up", message="replica")
        assert user.publish({"n": "confirmed"}).status_code == 201
    finally:
        stream.close()
        ws.close()
