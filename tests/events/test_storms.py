"""Storms of readers on the event hub, against the session's real Redis (one server, and the cluster).

A fresh worker after a reload takes thousands of readers at once, each waiting for Redis to confirm its
channels before it reads its history. There, every reader must read its history once (not again from a
resynchronisation sent by the link's first connection), the channels must go out in few SUBSCRIBEs, and
a link busy with a long fan-out must not be taken for a silent Redis (whose replacement would make every
reader of the link read its history again, adding to the storm). A real loss still resynchronises.

The scenarios run Hubs in a child process with gevent's monkey patching, as in a gunicorn worker (the
test process itself is not patched), one child per Redis mode for them all; it prints what each saw as
JSON on its last line, and each test checks one scenario's part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]

READERS = 200  # readers of a storm: enough that they arrive while the link connects
USERS = 20  # their own channels: several readers of each
SLOW_FAN_OUT_READERS = 2000  # a fan-out of many slices (FAN_OUT_SLICE), the listener yielding between
REQUESTS = 100  # requests that keep the worker's CPU busy meanwhile, each in turns of CPU and Redis


# The scenarios, run in the child (`python -c "...; scenarios(url, mode)"`).


def _topology(url: str, mode: str):
    from app.events.links import Cluster, OneServer
    from app.redis import connect

    return Cluster(connect(url, 8, "cluster"), url) if mode == "cluster" else OneServer(url)


def _until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the hub's greenlets run until `predicate()` holds (a bounded wait, not a delay)."""
    import gevent

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        gevent.sleep(0.005)


def _settled(hub) -> bool:
    """Every link connected, with no SUBSCRIBE unanswered and no resynchronisation still due."""
    return all(
        link.pubsub is not None and not link.unconfirmed and not link.resync_after for link in hub.links.values()
    )


def _beside(hub, channel: str, prefix: str) -> str:
    """A channel named `prefix`-n whose wake-up lives on the same node as `channel`'s (on a cluster: on
    the link that is connected already)."""
    from app.events.bus import wake_channel

    node = hub.home[wake_channel(channel)]
    return next(f"{prefix}-{n}" for n in range(10000) if hub.topology.node_of(wake_channel(f"{prefix}-{n}")) == node)


def _resyncs(subscription) -> int:
    from app.events.hub import RESYNC

    return sum(1 for item in subscription.items if item == RESYNC)


def _kill_hub_connections(url: str, mode: str) -> int:
    """Close this process's hub connections from Redis's side (a lost connection): how many."""
    name = f"auth-rt-hub:{os.getpid()}"
    urls = _node_urls(url, mode)
    killed = 0
    for node in urls:
        client = redis.Redis.from_url(node, decode_responses=True)
        for entry in client.client_list():
            if entry["name"] == name:
                killed += client.client_kill_filter(_id=entry["id"])
    return killed


def _node_urls(url: str, mode: str) -> list[str]:
    if mode != "cluster":
        return [url]
    client = redis.RedisCluster.from_url(url.split(",")[0], decode_responses=True)
    return [f"redis://{node.host}:{node.port}/0" for node in client.get_primaries()]


def _calls(url: str, mode: str, command: str) -> int:
    """How many times Redis ran `command` since its statistics were reset (summed over primaries)."""
    stats = [redis.Redis.from_url(node).info("commandstats") for node in _node_urls(url, mode)]
    return sum(each.get(f"cmdstat_{command}", {}).get("calls", 0) for each in stats)


def _close(hub) -> None:
    """Stop a scenario's hub: its links' listeners end and their connections close."""
    for link in list(hub.links.values()):
        link.greenlet.kill()


def scenario_storm(url: str, mode: str) -> dict:
    """READERS readers arrive at once on a fresh hub; then the link's connections are lost."""
    import gevent

    from app.events.hub import Hub

    for node in _node_urls(url, mode):
        redis.Redis.from_url(node).config_resetstat()
    hub = Hub(_topology(url, mode))
    subscribe = lambda n: hub.subscribe([f"user:storm-{n % USERS}", "broadcast"], f"u{n}", f"s{n}", 100)  # noqa: E731
    # All are spawned before the first one starts the link: they all arrive while it connects.
    readers = [gevent.spawn(subscribe, n) for n in range(READERS)]
    gevent.joinall(readers, timeout=30, raise_error=True)
    subscriptions = [reader.value for reader in readers]
    _until(lambda: _settled(hub), what="the first connections' confirmations")
    first = [_resyncs(s) for s in subscriptions]
    command = "ssubscribe" if mode == "cluster" else "subscribe"
    subscribes = _calls(url, mode, command)

    killed = _kill_hub_connections(url, mode)
    _until(lambda: all(_resyncs(s) >= first[i] + 1 for i, s in enumerate(subscriptions)), what="resynchronised")
    _until(lambda: _settled(hub), what="the new connections' confirmations")
    after_loss = [_resyncs(s) - first[i] for i, s in enumerate(subscriptions)]
    again = _calls(url, mode, command) - subscribes
    _close(hub)
    return {
        "first_connection_resyncs": first,
        "subscribes": subscribes,
        "killed": killed,
        "resyncs_after_loss": after_loss,
        "subscribes_after_loss": again,
    }


class _BurningOutlet:
    """A parked reader's outlet whose writes take CPU: a fan-out that keeps the listener busy. Each
    write counts itself in `written` and calls `on_write` first."""

    stalled = False

    def __init__(self, seconds: float, written: list, on_write):
        self.seconds, self.written, self.on_write = seconds, written, on_write

    def write(self, event) -> bool:
        return self.write_all([event])

    def write_all(self, events) -> bool:
        self.on_write()
        self.written[0] += 1
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return True


def scenario_busy(url: str, mode: str) -> dict:
    """A reader arrives at a busy worker: its link fans an event out, and a hundred requests take the CPU
    in turns (each turn of them all longer than the confirmation time-out), so Redis's answer waits in
    the socket a while before the listener reads it: the link is busy, Redis is not silent."""
    import gevent

    from app.events.bus import wake_channel
    from app.events.hub import Hub

    hub = Hub(_topology(url, mode))
    readers = [hub.subscribe(["broadcast"], f"u{n}", f"s{n}", 100) for n in range(SLOW_FAN_OUT_READERS)]
    _until(lambda: _settled(hub), what="confirmed")
    confirm_timeout = hub.confirm_timeout = 0.1  # connected: now a short time-out, to be quick
    hub.confirm_limit = 20  # seconds at most behind a busy link
    resynced_before = sum(_resyncs(s) for s in readers)
    links = dict(hub.links)
    pubsubs = {node: link.pubsub for node, link in links.items()}
    late: dict = {}
    written = [0]
    channel = _beside(hub, "broadcast", "user:late")

    client = redis.RedisCluster.from_url(url.split(",")[0]) if mode == "cluster" else redis.Redis.from_url(url)

    def request():  # 2 ms of CPU, then a Redis round trip, five times
        for _ in range(5):
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass
            client.exists("storm:busy")

    def arrive():  # in the middle of the fan-out (each of its slices takes 2.5 time-outs)
        late["requests"] = [gevent.spawn(request) for _ in range(REQUESTS)]
        late["arrived_after_writes"] = written[0]
        started = time.monotonic()
        try:
            late["subscription"] = hub.subscribe([channel, "broadcast"], "late", "late", 100)
            late["outcome"] = "subscribed"
        except redis.exceptions.TimeoutError:
            late["outcome"] = "503"
        late["waited"] = time.monotonic() - started

    per_write = 2.5 * confirm_timeout / 1000

    def on_write():  # the fan-out has begun: the late reader runs at its first yield
        if "g" not in late:
            late["g"] = gevent.spawn(arrive)

    for subscription in readers:
        subscription.outlet = _BurningOutlet(per_write, written, on_write)
    data = json.dumps({"id": "1-0", "channel": "broadcast", "event": "tick", "data": "1", "ts": "t"})
    (client.spublish if mode == "cluster" else client.publish)(wake_channel("broadcast"), data)
    _until(lambda: "g" in late and late["g"].dead, timeout=30, what="the late reader")
    late["g"].get()
    gevent.joinall(late["requests"], raise_error=True)
    _until(lambda: _settled(hub), what="settled")
    seen = {
        "outcome": late["outcome"],
        "waited": late["waited"],
        "arrived_after_writes": late["arrived_after_writes"],
        "writes": written[0],
        "confirm_timeout": confirm_timeout,
        "replaced": sorted(
            node for node, link in links.items() if hub.links.get(node) is not link or link.pubsub is not pubsubs[node]
        ),
        "resyncs": sum(_resyncs(s) for s in readers) - resynced_before,
    }
    _close(hub)
    return seen


def scenario_silent(url: str, mode: str) -> dict:
    """Redis stops answering (CLIENT PAUSE) while a reader waits for its confirmation."""
    from app.events.bus import wake_channel
    from app.events.hub import Hub

    hub = Hub(_topology(url, mode))
    first = hub.subscribe(["user:quiet"], "u", "s", 100)
    _until(lambda: _settled(hub), what="confirmed")
    confirm_timeout = hub.confirm_timeout = 0.2  # connected: now a short time-out, to be quick
    hub.confirm_limit = 20  # seconds at most behind a busy link
    node = hub.home[wake_channel("user:quiet")]
    link = hub.links[node]
    pubsub = link.pubsub
    redis.Redis.from_url(node).execute_command("CLIENT", "PAUSE", int(confirm_timeout * 1000 * 5), "ALL")
    started = time.monotonic()
    try:
        hub.subscribe([_beside(hub, "user:quiet", "user:quiet")], "u2", "s2", 100)
        outcome = "subscribed"
    except redis.exceptions.TimeoutError:
        outcome = "503"
    waited = time.monotonic() - started
    replaced = link.pubsub is not pubsub
    _until(lambda: _resyncs(first) == 1, timeout=15, what="the first reader resynchronised")
    _close(hub)
    return {"outcome": outcome, "waited": waited, "replaced": replaced, "confirm_timeout": confirm_timeout}


def _subscribed_in_redis(url: str, mode: str, names: list[str]) -> int:
    """How many of the (wake-up) channels `names` some connection holds, as Redis counts them."""
    command = ("PUBSUB", "SHARDNUMSUB") if mode == "cluster" else ("PUBSUB", "NUMSUB")
    held = 0
    for node in _node_urls(url, mode):
        answer = redis.Redis.from_url(node).execute_command(*command, *names)
        held += sum(1 for count in answer[1::2] if int(count) > 0)
    return held


def scenario_leave(url: str, mode: str) -> dict:
    """READERS readers of their own channels and broadcast leave at once; then a channel is left by its last
    reader and taken again by a new one before the loop turns."""
    import gevent

    from app.events.bus import wake_channel
    from app.events.hub import Hub

    hub = Hub(_topology(url, mode))
    hub.subscribe([], "u-first", "s-first", 100)  # the hub's link and control channel, before the count
    for node in _node_urls(url, mode):
        redis.Redis.from_url(node).config_resetstat()
    channels = [f"user:leave-{n}" for n in range(READERS)]
    readers = [
        gevent.spawn(hub.subscribe, [channel, "broadcast"], f"u{n}", f"s{n}", 100) for n, channel in enumerate(channels)
    ]
    gevent.joinall(readers, timeout=30, raise_error=True)
    _until(lambda: _settled(hub), what="the readers' confirmations")
    subscribes = _calls(url, mode, "ssubscribe" if mode == "cluster" else "subscribe")
    names = [wake_channel(channel) for channel in [*channels, "broadcast"]]
    held_before = _subscribed_in_redis(url, mode, names)
    for node in _node_urls(url, mode):
        redis.Redis.from_url(node).config_resetstat()
    leavers = [gevent.spawn(hub.unsubscribe, reader.value) for reader in readers]
    gevent.joinall(leavers, timeout=30, raise_error=True)
    _until(lambda: _subscribed_in_redis(url, mode, names) == 0, what="every channel left in Redis")
    unsubscribes = _calls(url, mode, "sunsubscribe" if mode == "cluster" else "unsubscribe")

    first = hub.subscribe(["user:again"], "ua", "sa", 100)
    _until(lambda: _settled(hub), what="the first reader of user:again confirmed")
    hub.unsubscribe(first)  # its last reader: the channel is left ...
    hub.subscribe(["user:again"], "ub", "sb", 100)  # ... and taken again, before the loop turned
    _until(lambda: _settled(hub), what="the second reader of user:again confirmed")
    _until(lambda: not any(link.pending or link.pending_soon for link in hub.links.values()), what="left")
    again = _subscribed_in_redis(url, mode, [wake_channel("user:again")])
    _close(hub)
    return {"held_before": held_before, "subscribes": subscribes, "unsubscribes": unsubscribes, "again_held": again}


def scenarios(url: str, mode: str) -> None:
    """Every scenario in turn (each with a hub of its own); a failing one reports its traceback."""
    seen = {}
    for name in ("storm", "busy", "silent", "leave"):
        try:
            seen[name] = globals()[f"scenario_{name}"](url, mode)
        except Exception:  # noqa: BLE001 - reported to the test that checks this scenario
            seen[name] = {"error": traceback.format_exc()}
    print(json.dumps(seen))


# The tests.


@pytest.fixture(scope="module")
def seen(redis_server) -> dict:
    """What each scenario saw, run once per Redis mode in a gevent-patched child process."""
    code = "from gevent import monkey; monkey.patch_all()\nimport sys\nfrom tests.events.test_storms import scenarios\n"
    done = subprocess.run(
        [sys.executable, "-c", code + "scenarios(*sys.argv[1:])", redis_server.url, redis_server.mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def scenario(seen: dict, name: str) -> dict:
    assert "error" not in seen[name], seen[name]["error"]
    return seen[name]


def test_readers_of_a_fresh_link_read_history_once_and_a_lost_connection_resynchronises_them(seen, redis_mode):
    storm = scenario(seen, "storm")
    # No reader was confirmed before the first connection: none is told to read its history again.
    assert storm["first_connection_resyncs"] == [0] * READERS
    # Their channels went out together, not one SUBSCRIBE per reader and channel in turn.
    if redis_mode == "cluster":  # SSUBSCRIBE takes one channel: once per channel and connection
        assert storm["subscribes"] == storm["subscribes_after_loss"] == USERS + 2  # users', broadcast, control
    else:  # one SUBSCRIBE of them all on the first connection, one again on the new one
        assert storm["subscribes"] == storm["subscribes_after_loss"] == 1
    # A real loss: every reader reads its history again (once per connection it depended on).
    assert storm["killed"] >= 1
    assert all(n >= 1 for n in storm["resyncs_after_loss"])
    if redis_mode == "standalone":
        assert storm["resyncs_after_loss"] == [1] * READERS


def test_a_busy_link_is_not_taken_for_a_silent_redis(seen):
    busy = scenario(seen, "busy")
    assert 0 < busy["arrived_after_writes"] < busy["writes"] == SLOW_FAN_OUT_READERS, busy  # during the fan-out
    assert busy["outcome"] == "subscribed", busy
    assert busy["waited"] > busy["confirm_timeout"], busy  # it did wait behind the busy link, past the time-out
    # The connection was kept: no reader of it was told to read its history again.
    assert busy["replaced"] == [] and busy["resyncs"] == 0, busy


def test_a_silent_redis_is_still_noticed_and_the_connection_replaced(seen):
    silent = scenario(seen, "silent")
    assert silent["outcome"] == "503" and silent["replaced"], silent
    assert silent["waited"] < 3 * silent["confirm_timeout"] + 1, silent


def test_readers_leaving_together_leave_their_channels_in_one_command_and_a_channel_taken_again_stays(seen, redis_mode):
    leave = scenario(seen, "leave")
    assert leave["held_before"] == READERS + 1  # every reader's channel, and broadcast
    if redis_mode == "cluster":  # SSUBSCRIBE of channels of one slot only: once per channel
        assert leave["subscribes"] == READERS + 1
    else:  # the readers arriving together subscribe together (it was one command per reader)
        assert leave["subscribes"] <= 3
    if redis_mode == "cluster":  # SUNSUBSCRIBE takes one channel: once per channel
        assert leave["unsubscribes"] == READERS + 1
    else:  # one UNSUBSCRIBE of them all (it was one per reader)
        assert leave["unsubscribes"] == 1
    # Left and taken again in one turn: the UNSUBSCRIBE still went out before the SUBSCRIBE that followed it.
    assert leave["again_held"] == 1
