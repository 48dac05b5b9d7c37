"""The Redis client under gevent: checking a pooled connection before a command does not wait for the loop,
and concurrent session checks share round trips."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.servers import ROOT, VENV_BIN, process_env

PROBE = """
import json, socket
from gevent import monkey
monkey.patch_all()
import gevent
import redis._parsers.hiredis as hiredis_parser
gevents_check = hiredis_parser._socket_can_read
import app.redis  # noqa: F401  (replaces the check)

idle, peer = socket.socketpair()

def ran_during(can_read, timeout):
    other_ran = []
    gevent.spawn(other_ran.append, True)
    readable = can_read(idle, timeout)
    return {"readable": readable, "yielded": bool(other_ran)}

answers = {
    "gevent, idle": ran_during(gevents_check, 0),
    "ours, idle": ran_during(hiredis_parser._socket_can_read, 0),
    "ours, a wait": ran_during(hiredis_parser._socket_can_read, 0.05),
}
peer.send(b"+stray\\r\\n")
answers["ours, stray bytes"] = ran_during(hiredis_parser._socket_can_read, 0)
print(json.dumps(answers))
"""


def run_probe(source: str, *args: str) -> dict:
    """Run a probe in a fresh interpreter of the project's venv; the JSON it prints."""
    command = [str(VENV_BIN / "python"), "-c", source, *args]
    result = subprocess.run(command, cwd=ROOT, env=process_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_check_for_stray_bytes_answers_without_yielding_and_a_wait_still_yields():
    answers = run_probe(PROBE)
    assert answers["gevent, idle"] == {"readable": False, "yielded": True}  # what the test can tell apart
    assert answers["ours, idle"] == {"readable": False, "yielded": False}
    assert answers["ours, stray bytes"] == {"readable": True, "yielded": False}
    assert answers["ours, a wait"] == {"readable": False, "yielded": True}


SHARED_PROBE = """
import json, socket, sys, time
from gevent import monkey
monkey.patch_all()
import gevent
import redis
from app.redis import SharedRoundTrips, shared_round_trips

client = redis.Redis.from_url(sys.argv[1], decode_responses=True)
script = client.register_script("return redis.call('GET', KEYS[1]) .. '|' .. ARGV[1]")
shared = shared_round_trips(client, script)
sizes = []
round_trip = shared._round_trip
shared._round_trip = lambda calls: sizes.append(len(calls)) or round_trip(calls)

def call(key, arg):
    try:
        return shared(keys=[key], args=[arg])
    except redis.RedisError as error:
        return type(error).__name__

READS = [("get", ("k2",), {}), ("get", ("k7",), {}), ("hget", ("k7", "field"), {})]

def reading(key, arg):
    try:
        answer, read = shared.with_reads(keys=[key], args=[arg], reads=READS)
    except redis.RedisError as error:
        return type(error).__name__
    return [answer, [type(value).__name__ if isinstance(value, Exception) else value for value in read]]

def together(count, key=lambda n: f"k{n}"):
    callers = [gevent.spawn(call, key(n), str(n)) for n in range(count)]
    gevent.joinall(callers)
    return [caller.value for caller in callers]

for n in range(50):
    client.set(f"k{n}", f"v{n}")
client.delete("k7")
client.hset("k7", "field", "x")
answers = {"class": type(shared).__name__, "alone": call("k1", "a")}
answers["together"] = together(50)
answers["sizes"] = sizes[1:]
callers = [gevent.spawn(reading if n % 2 else call, f"k{n}", str(n)) for n in range(8)]
gevent.joinall(callers)
answers["with reads, among plain calls"] = [caller.value for caller in callers]
client.script_flush()
answers["after a flush"] = together(5)
client.script_flush()
callers = [gevent.spawn(reading if n % 2 else call, f"k{n}", str(n)) for n in range(4)]
gevent.joinall(callers)
answers["with reads among plain calls, after a flush"] = [caller.value for caller in callers]
client.client_kill_filter(_type="normal", skipme=True)  # the shared round trips' own connection among them
answers["after its connection was closed"] = together(5)
client.execute_command("CLIENT", "PAUSE", 300)  # in force once answered: Redis answers nobody for 0.3 s

def impatient():
    try:
        with gevent.Timeout(0.1):
            return call("k0", "0")
    except gevent.Timeout:
        return "gave up"

callers = [gevent.spawn(impatient)] + [gevent.spawn(call, f"k{n}", str(n)) for n in range(1, 5)]
gevent.joinall(callers)
answers["one caller gave up"] = [caller.value for caller in callers]
refused = socket.socket()
refused.bind(("127.0.0.1", 0))
port = refused.getsockname()[1]
refused.close()
once = redis.retry.Retry(redis.backoff.NoBackoff(), 0)  # redis-py's own retries of a connect (with backoff) aside
down = redis.Redis(port=port, socket_connect_timeout=1, retry=once)
shared = SharedRoundTrips(down, down.register_script("return 1"))
connects = []
real_connect = redis.connection.Connection.connect
redis.connection.Connection.connect = lambda self: connects.append(self) or real_connect(self)
answers["redis down"] = together(3)
answers["connections tried while down"] = len(connects)
redis.connection.Connection.connect = real_connect
silent = socket.socket()  # takes connections and never answers
silent.bind(("127.0.0.1", 0))
silent.listen(8)
mute = redis.Redis(port=silent.getsockname()[1], socket_connect_timeout=1, socket_timeout=0.3, retry=once)
shared = SharedRoundTrips(mute, mute.register_script("return 1"))
started = time.monotonic()
answers["redis silent"] = together(3)
answers["silent for"] = time.monotonic() - started
print(json.dumps(answers))
"""


@pytest.mark.not_on_cluster("one pipeline serves callers whose keys share one server")
def test_concurrent_session_checks_share_round_trips_and_each_caller_gets_its_own_answer(redis_server):
    from app.redis import shared_round_trips

    answers = run_probe(SHARED_PROBE, redis_server.url)
    assert answers["class"] == "SharedRoundTrips"
    assert answers["alone"] == "v1|a"
    expected = [f"v{n}|{n}" for n in range(50)]
    expected[7] = "ResponseError"  # a hash: only its own caller gets the error
    assert answers["together"] == expected
    assert len(answers["sizes"]) < 10 and sum(answers["sizes"]) == 50  # 50 calls in a few round trips
    with_reads = ["v2", "ResponseError", "x"]  # each read's answer, an error as the value, after the script's
    mixed = [[f"v{n}|{n}", with_reads] if n % 2 else f"v{n}|{n}" for n in range(8)]
    mixed[7] = "ResponseError"  # the script's own error is raised, reads or not
    assert answers["with reads, among plain calls"] == mixed
    assert answers["after a flush"] == [f"v{n}|{n}" for n in range(5)]
    assert answers["with reads among plain calls, after a flush"] == mixed[:4]
    assert answers["after its connection was closed"] == [f"v{n}|{n}" for n in range(5)]  # replaced, not failed
    assert answers["one caller gave up"] == ["gave up"] + [f"v{n}|{n}" for n in range(1, 5)]  # the others unharmed
    assert answers["redis down"] == ["ConnectionError"] * 3
    assert answers["connections tried while down"] == 1  # one round trip for the three, one connect time-out
    assert answers["redis silent"] == ["TimeoutError"] * 3  # each caller's wait is bounded by the reads' time-out
    assert answers["silent for"] < 5  # one attempt: about one read time-out (0.3 s), with room for a busy machine
    unpatched = object()
    assert shared_round_trips(None, unpatched) is unpatched  # this process has no gevent sockets: direct calls
