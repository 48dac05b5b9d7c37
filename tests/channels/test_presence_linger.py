"""PRESENCE_LINGER_SECONDS: a user who stops being present and is present again within the linger causes
neither `presence.leave` nor `presence.join`, on any worker or instance, so no client can fill a channel's
history with them; a user who leaves for good gets its leave once the linger is over, even when the worker
that saw it go died meanwhile. The count and the list follow connections at once.

Keepers (as workers) against the session's Redis in both modes, and two gunicorn instances for the
transports (one WebSocket sending subscribe and unsubscribe frames as fast as it can; a reader moving from
one instance to the other).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from app.channels.presence import PresenceKeeper
from app.redis import Keys
from tests.channels.test_presence import CHANNEL, SHORT_TIMEOUT, changes, present, pump, run_worker
from tests.events.clients import SSE, Api, open_ws, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until

LINGER = 1.0  # short, for the keepers' tests
JOIN, LEAVE = "presence.join", "presence.leave"
MARGIN = 3.0  # what a loaded machine may add to a leave's due time


@pytest.fixture
def keepers(rdb):
    """Make keepers (each as one worker's) with a linger; their greenlets stop after the test."""
    made = []

    def make(linger: float = LINGER, timeout: float = 60) -> PresenceKeeper:
        keeper = PresenceKeeper(rdb, timeout, linger_seconds=linger)
        made.append(keeper)
        return keeper

    yield make
    for keeper in made:
        keeper.stop()


def await_leave(rdb, user: str, since: float, linger: float = LINGER, channel: str = CHANNEL) -> float:
    """Wait for `user`'s leave (giving the keepers' greenlets their turns); the seconds since `since`."""
    pump(lambda: (LEAVE, user) in changes(rdb, channel), timeout=linger + 10, message=f"{user}'s leave")
    return time.monotonic() - since


def test_a_user_who_leaves_for_good_leaves_after_the_linger_and_stops_counting_at_once(keepers, rdb):
    keeper = keepers()
    entry = keeper.enter(CHANNEL, "ann", True)
    assert changes(rdb) == [(JOIN, "ann")]
    left_at = time.monotonic()
    keeper.leave(entry)
    assert keeper.snapshot(CHANNEL) == {"channel": CHANNEL, "count": 0, "users": []}, "the list follows at once"
    assert changes(rdb) == [(JOIN, "ann")], "the leave lingers"
    assert rdb.zscore(Keys.presence_lingering(CHANNEL), "ann") is not None
    elapsed = await_leave(rdb, "ann", left_at)
    assert LINGER - 0.05 <= elapsed < LINGER + MARGIN
    assert changes(rdb) == [(JOIN, "ann"), (LEAVE, "ann")]
    pump(lambda: rdb.zscore(Keys.presence_channels(), CHANNEL) is None, message="the channel out of the index")
    assert rdb.exists(Keys.presence_lingering(CHANNEL), Keys.presence(CHANNEL), Keys.presence_users(CHANNEL)) == 0


def test_back_within_the_linger_on_another_worker_causes_neither_leave_nor_join(keepers, rdb):
    first, second = keepers(), keepers()
    entry = first.enter(CHANNEL, "ann", True)
    first.leave(entry)
    assert first.snapshot(CHANNEL)["count"] == 0
    entry = second.enter(CHANNEL, "ann", True)  # another worker, well within the linger
    assert present(first.snapshot(CHANNEL)) == {"ann": 1}
    assert first.settle_at, "the first keeper will settle the channel when the leave it saw is due"
    pump(lambda: not first.settle_at, message="the first keeper's settling step")  # it ran, and found ann back
    assert changes(rdb) == [(JOIN, "ann")]

    left_at = time.monotonic()  # and for good from the second: the leave that was owed, once
    second.leave(entry)
    assert LINGER - 0.05 <= await_leave(rdb, "ann", left_at) < LINGER + MARGIN
    assert changes(rdb) == [(JOIN, "ann"), (LEAVE, "ann")]


def test_entering_and_leaving_in_a_loop_publishes_one_join_then_one_leave(keepers, rdb):
    keeper, other = keepers(), keepers()
    bob = other.enter(CHANNEL, "bob", True)  # someone else in the room, leaving for good meanwhile
    for n in range(300):
        entry = keeper.enter(CHANNEL, "ann", True)
        keeper.leave(entry)
        if n == 150:
            other.leave(bob)
    left_at = time.monotonic()
    assert changes(rdb) == [(JOIN, "bob"), (JOIN, "ann")]
    assert len(keeper.settle_at) == 1, "one settling of the channel pending, however many leaves"
    await_leave(rdb, "bob", left_at)
    assert LINGER - 0.05 <= await_leave(rdb, "ann", left_at) < LINGER + MARGIN
    assert changes(rdb) == [(JOIN, "bob"), (JOIN, "ann"), (LEAVE, "bob"), (LEAVE, "ann")]


def test_without_a_linger_the_leave_is_published_at_once(keepers, rdb):
    keeper = keepers(linger=0)
    keeper.leave(keeper.enter(CHANNEL, "ann", True))
    keeper.leave(keeper.enter(CHANNEL, "ann", True))
    assert changes(rdb) == [(JOIN, "ann"), (LEAVE, "ann")] * 2
    assert rdb.exists(Keys.presence_lingering(CHANNEL)) == 0 and not keeper.settle_at


def test_a_leave_due_but_not_yet_published_goes_out_before_the_users_next_join(keepers, rdb):
    keeper = keepers(linger=0.2)
    keeper.leave(keeper.enter(CHANNEL, "ann", True))
    keeper.stop()  # its settler is gone: nobody publishes the leave when it is due
    wait_until(
        lambda: rdb.zscore(Keys.presence_lingering(CHANNEL), "ann") < time.time() * 1000 - 50, message="the leave due"
    )
    keeper.enter(CHANNEL, "ann", True)  # absent longer than the linger: a leave, then a join
    assert changes(rdb) == [(JOIN, "ann"), (LEAVE, "ann"), (JOIN, "ann")]


def test_info_of_a_lingering_leave_is_the_grant_in_force_when_it_is_published(keepers, rdb):
    rdb.hset(Keys.channel_members(CHANNEL), "ann", json.dumps({"info": {"name": "Ann"}, "expires_at": None}))
    keeper = keepers()
    left_at = time.monotonic()
    keeper.leave(keeper.enter(CHANNEL, "ann", True))
    rdb.hdel(Keys.channel_members(CHANNEL), "ann")  # revoked while its leave lingers
    await_leave(rdb, "ann", left_at)
    stored = [json.loads(f["data"]) for _, f in rdb.xrange(Keys.stream(CHANNEL))]
    assert stored == [{"user_id": "ann", "info": {"name": "Ann"}}, {"user_id": "ann", "info": None}]


@pytest.mark.slow
def test_leaves_of_a_worker_that_died_are_published_by_the_reapers(keepers, rdb, redis_server):
    """ann left cleanly, her leave pending, and bob was still there: their worker is killed. The reapers of
    the other workers publish both leaves, within the timeout and the linger."""
    linger = 2.0
    worker = run_worker(redis_server, "leave", SHORT_TIMEOUT, "ann,bob", linger=linger)
    try:
        assert worker.stdout.readline().strip() == "ready"
        os.kill(worker.pid, signal.SIGKILL)
        killed = time.monotonic()
        worker.wait(10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        worker.stdout.close()
    assert changes(rdb) == [(JOIN, "ann"), (JOIN, "bob")], "ann's leave was pending when her worker died"
    for _ in range(2):  # the reapers of two other workers
        keepers(linger=linger, timeout=SHORT_TIMEOUT).start()

    assert await_leave(rdb, "ann", killed, linger + SHORT_TIMEOUT) < linger + SHORT_TIMEOUT
    assert await_leave(rdb, "bob", killed, linger + SHORT_TIMEOUT) < linger + SHORT_TIMEOUT
    assert changes(rdb) == [(JOIN, "ann"), (JOIN, "bob"), (LEAVE, "ann"), (LEAVE, "bob")]
    pump(lambda: rdb.zscore(Keys.presence_channels(), CHANNEL) is None, message="the channel out of the index")


# Through the transports: two instances (one worker each) on the session's Redis, with the default linger.

DEFAULT_LINGER = 2.0
# The linger's Redis steps run in both modes in the keeper tests above; these add the transports.
TRANSPORTS_ON_ONE_REDIS = "the linger's steps are tested on the cluster above; this adds two instances and a socket"


@pytest.fixture(scope="module")
def instances(base_env, tmp_path_factory):
    """Two gunicorn instances; frames are not rate-limited here, so only the linger keeps the history clean."""
    env = {**base_env, **FAST, "WS_FRAME_RATE": "100000"}
    logs = tmp_path_factory.mktemp("logs")
    started = [LiveServer(env, log_path=logs / f"gunicorn-{n}.log") for n in range(2)]
    try:
        for live in started:
            live.start()
        yield started
    finally:
        for live in started:
            live.stop()


def presence_count(user: Api, channel: str) -> int:
    answer = user.http.get(f"{user.base}/channels/{channel}/presence", headers=user.auth, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["count"]


@pytest.mark.not_on_cluster(TRANSPORTS_ON_ONE_REDIS)
def test_a_websocket_flooding_subscribe_and_unsubscribe_frames_publishes_one_join(instances, namespace, rdb):
    namespace("flood", subscribe="authenticated", publish="subscribers", presence=True, join_leave=True)
    room = "flood:room"
    user = Api(instances[0].url)
    ws = open_ws(instances[0].url, user.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        pairs = 300
        for _ in range(pairs):
            ws.send(json.dumps({"type": "subscribe", "channel": room}))
            ws.send(json.dumps({"type": "unsubscribe", "channel": room}))
        ws.send(json.dumps({"type": "subscribe", "channel": room}))  # and stays
        answers = []  # the answers to the frames, in order (the room's own events come between them)
        while len(answers) < 2 * pairs + 1:
            frame = ws_json(ws, 30)
            if frame.get("channel") == room and frame["type"] != "event":
                answers.append(frame["type"])
        assert answers == ["subscribed", "unsubscribed"] * pairs + ["subscribed"], "every frame was acted on"
        assert changes(rdb, room) == [(JOIN, user.user_id)]
        assert presence_count(user, room) == 1

        ws.send(json.dumps({"type": "unsubscribe", "channel": room}))
        wait_until(lambda: ws_json(ws)["type"] == "unsubscribed", message="unsubscribed")
        left_at = time.monotonic()
        assert presence_count(user, room) == 0, "the count follows the connection at once"
        wait_until(lambda: (LEAVE, user.user_id) in changes(rdb, room), timeout=DEFAULT_LINGER + 10, message="leave")
        assert time.monotonic() - left_at >= DEFAULT_LINGER - 0.1
        assert changes(rdb, room) == [(JOIN, user.user_id), (LEAVE, user.user_id)]
    finally:
        ws.close()


@pytest.mark.not_on_cluster(TRANSPORTS_ON_ONE_REDIS)
def test_a_reader_moving_to_another_instance_within_the_linger_neither_leaves_nor_joins(instances, namespace, rdb):
    namespace("move", subscribe="authenticated", publish="subscribers", presence=True, join_leave=True)
    room = "move:room"
    user = Api(instances[0].url)
    first = SSE(instances[0].url, user.auth, params={"channels": room})
    wait_until(lambda: changes(rdb, room) == [(JOIN, user.user_id)], message="the join")
    first.close()
    wait_until(lambda: presence_count(user, room) == 0, message="the first stream no longer counted")
    second = SSE(instances[1].url, user.auth, params={"channels": room})  # within the linger, elsewhere
    try:
        wait_until(lambda: presence_count(user, room) == 1, message="the second stream counted")
        assert changes(rdb, room) == [(JOIN, user.user_id)]
    finally:
        second.close()
    left_at = time.monotonic()
    wait_until(lambda: (LEAVE, user.user_id) in changes(rdb, room), timeout=DEFAULT_LINGER + 10, message="leave")
    assert time.monotonic() - left_at < DEFAULT_LINGER + MARGIN
    assert changes(rdb, room) == [(JOIN, user.user_id), (LEAVE, user.user_id)]
