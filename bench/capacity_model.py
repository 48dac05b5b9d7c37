"""Inputs of the capacity model (docs/capacity.md), measured at small scale, and the model checked on a cluster.

`python -m bench.capacity_model` first measures, on one Redis and one instance (2 workers), what one open
connection and one published event cost: server memory and CPU, Redis commands, CPU and output bytes.
It then runs several instances (1 worker each) on a local 3-primary Redis Cluster under a known load,
predicts from the unit figures what that load should cost, and prints the prediction beside the
measurement. Results go to `bench/results/capacity_model.json`; `make bench` runs it too.

Load shape: `users` users, each with `per_user` SSE streams; events published with an API key,
round-robin over the users' channels (so each event is read by `per_user` streams).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
import requests

from bench.common import machine, publisher_key, service_env
from bench.streams import StreamFleet, Target, tag
from tests.events.clients import Api
from tests.servers import LiveServer, RedisClusterServer, RedisServer

RESULTS = Path(__file__).parent / "results" / "capacity_model.json"
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- what processes and Redis nodes have used so far -------------------------------------------------


def process_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def process_rss(pids: list[int]) -> int:
    return sum(int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE for pid in pids)


def redis_reading(nodes: list[redis.Redis]) -> dict:
    """Commands called, CPU seconds and output bytes, per node (an INFO's own reply is small: ignored)."""
    readings = []
    for node in nodes:
        info = node.info("all")
        calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items() if k.startswith("cmdstat_")}
        readings.append(
            {
                "calls": calls,
                "cpu": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
                "out": int(info["total_net_output_bytes"]),
                "memory": int(info["used_memory"]),
            }
        )
    return {"nodes": readings}


def redis_delta(before: dict, after: dict) -> dict:
    """Per node: commands (all but INFO), CPU seconds and output bytes between two readings."""
    nodes = []
    for b, a in zip(before["nodes"], after["nodes"], strict=True):
        calls = {k: v - b["calls"].get(k, 0) for k, v in a["calls"].items() if k not in {"info", "ping"}}
        nodes.append(
            {
                "commands": sum(calls.values()),
                "by_command": {k: v for k, v in sorted(calls.items()) if v},
                "cpu": a["cpu"] - b["cpu"],
                "out": a["out"] - b["out"],
                "memory": a["memory"] - b["memory"],
            }
        )
    return {
        "nodes": nodes,
        "commands": sum(n["commands"] for n in nodes),
        "cpu": sum(n["cpu"] for n in nodes),
        "out": sum(n["out"] for n in nodes),
        "memory": sum(n["memory"] for n in nodes),
    }


# --- the load: streams in client processes, events from a thread pool ----------------------------------


def sse_target(base: str, headers: dict) -> Target:
    host, port = base.removeprefix("http://").split(":")
    return Target("sse", host, int(port), "/events/stream", headers)


def make_users(bases: list[str], count: int) -> list[tuple[str, Api]]:
    """`count` registered users, spread round-robin over the instances: (instance url, user)."""
    with ThreadPoolExecutor(8) as pool:
        users = list(pool.map(Api, [bases[i % len(bases)] for i in range(count)]))
    return [(bases[i % len(bases)], user) for i, user in enumerate(users)]


def publisher(key: str) -> requests.Session:
    """An HTTP session that publishes with the API key, with a connection for each of 16 threads."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=16))
    return session


def publish_round_robin(bases: list[str], key: str, channels: list[str], events: int, rate: float, token: str) -> float:
    """Publish `events` events at about `rate`/s, channel after channel; the seconds it took."""
    session = publisher(key)
    targets = itertools.cycle(bases)
    started = time.perf_counter()

    def one(n: int) -> None:
        due = started + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        body = {"channel": channels[n % len(channels)], "event": "capacity", "data": tag(token, n)}
        answer = session.post(f"{next(targets)}/events", json=body, timeout=30)
        answer.raise_for_status()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(events)))
    return time.perf_counter() - started


def publish_batches(base: str, key: str, channel: str, events: int, token: str, size: int = 100) -> float:
    """Publish `events` events to one channel through /events/batch, `size` at a time; the seconds it took."""
    session = publisher(key)
    started = time.perf_counter()

    def one(first: int) -> None:
        batch = [
            {"channel": channel, "event": "capacity", "data": tag(token, n)}
            for n in range(first, min(events, first + size))
        ]
        session.post(f"{base}/events/batch", json={"events": batch}, timeout=30).raise_for_status()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(0, events, size)))
    return time.perf_counter() - started


# --- phase 1: unit figures on one Redis ---------------------------------------------------------------


def unit_figures(users: int, per_user: int, events: int, rate: float, idle_seconds: float) -> dict:
    """What one connection and one event cost, on one Redis and one instance of 2 workers."""
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisServer(Path(tmp))
        redis_server.start()
        env = {**service_env(redis_server, tmp), "MAX_CONNECTIONS_PER_USER": "1000"}
        server = LiveServer(env, workers=2)
        server.start()
        try:
            return _unit_figures(server, redis_server.client(), env, users, per_user, events, rate, idle_seconds)
        finally:
            server.stop()
            redis_server.stop()


def _unit_figures(server, client, env, users, per_user, events, rate, idle_seconds) -> dict:
    pids = server.worker_pids() + [server.process.pid]
    accounts = make_users([server.url], users)
    key = publisher_key(env)
    token = f"cap{os.getpid()}x"
    targets = [sse_target(base, user.auth) for base, user in accounts for _ in range(per_user)]
    connections = len(targets)
    streams = StreamFleet(targets[0], len(targets), token, expected=events // users, targets=targets)

    quiet = (redis_reading([client]), process_cpu(pids))
    time.sleep(idle_seconds)  # no connection: the workers' own background work
    before_open = (redis_reading([client]), process_cpu(pids), process_rss(pids))
    streams.open()
    time.sleep(1)  # the last streams' subscriptions and history reads
    opened = (redis_reading([client]), process_cpu(pids), process_rss(pids))
    time.sleep(idle_seconds)  # heartbeats and lease renewals only
    idle = (redis_reading([client]), process_cpu(pids))
    seconds = publish_round_robin([server.url], key, [u.channel for _, u in accounts], events, rate, token)
    delivered = sum(len(arrivals) for arrivals in streams.collect()[0])
    published = (redis_reading([client]), process_cpu(pids))

    # The same number of events to a channel nobody reads: the cost of publishing alone.
    alone = publish_round_robin([server.url], key, ["nobody-reads-this"], events, rate, token)
    alone_end = (redis_reading([client]), process_cpu(pids))
    batched = publish_batches(server.url, key, "nobody-reads-this", events, token)
    batched_end = (redis_reading([client]), process_cpu(pids))

    open_redis = redis_delta(before_open[0], opened[0])
    baseline_redis = redis_delta(quiet[0], before_open[0])
    baseline_cpu = before_open[1] - quiet[1]
    idle_redis = redis_delta(opened[0], idle[0])
    batch_redis = redis_delta(alone_end[0], batched_end[0])
    event_redis = redis_delta(idle[0], published[0])
    publish_redis = redis_delta(published[0], alone_end[0])
    publish_cpu = (alone_end[1] - published[1]) / events
    event_cpu = (published[1] - idle[1]) / events
    deliveries = events // users * connections
    stream_bytes = client.memory_usage(f"events:{{{accounts[0][1].channel}}}")
    stream_length = client.xlen(f"events:{{{accounts[0][1].channel}}}")
    return {
        "connections": connections,
        "users": users,
        "events": events,
        "rate_asked": rate,
        "rate_achieved": round(events / seconds, 1),
        "publish_alone_rate": round(events / alone, 1),
        "deliveries_expected": deliveries,
        "deliveries": delivered,
        "rss_per_connection_kb": round((opened[2] - before_open[2]) / connections / 1024, 1),
        "redis_commands_per_connection_open": round(open_redis["commands"] / connections, 2),
        "redis_commands_per_connection_second": round(
            max(0, idle_redis["commands"] - baseline_redis["commands"]) / connections / idle_seconds, 4
        ),
        "server_cpu_ms_per_connection_open": round((opened[1] - before_open[1]) / connections * 1000, 3),
        "server_cpu_us_per_idle_connection_second": round(
            max(0.0, idle[1] - opened[1] - baseline_cpu) / connections / idle_seconds * 1e6, 2
        ),
        "server_cpu_ms_per_publish": round(publish_cpu * 1000, 3),
        "batch_rate": round(events / batched, 1),
        "server_cpu_us_per_batched_event": round((batched_end[1] - alone_end[1]) / events * 1e6, 1),
        "redis_cpu_us_per_batched_event": round(batch_redis["cpu"] / events * 1e6, 1),
        "server_cpu_us_per_delivery": round(max(0.0, event_cpu - publish_cpu) * events / deliveries * 1e6, 2),
        "redis_commands_per_publish": round(publish_redis["commands"] / events, 2),
        "redis_cpu_us_per_publish": round(publish_redis["cpu"] / events * 1e6, 1),
        "redis_cpu_us_per_read_event": round(max(0.0, event_redis["cpu"] - publish_redis["cpu"]) / events * 1e6, 1),
        "redis_out_bytes_per_read_event": round(event_redis["out"] / events, 1),
        "redis_bytes_per_history_entry": round(stream_bytes / max(1, stream_length), 1),
        "idle_seconds": idle_seconds,
        "by_command_per_publish": {k: round(v / events, 2) for k, v in publish_redis["nodes"][0]["by_command"].items()},
    }


# --- the model ----------------------------------------------------------------------------------------


def model(
    unit: dict,
    connections: int,
    events_per_second: float,
    readers_per_event: float,
    batched: bool = False,
    reading_instances: float | None = None,
    **limits,
) -> dict:
    """Instances and Redis shards for a load, from the unit figures (the arithmetic of docs/capacity.md).

    `batched`: the publishers send /events/batch requests of 100 events instead of one request per event.
    `reading_instances`: how many instances have readers of an event's channel (Redis sends the event
    once to each); by default each reader is taken to be on its own instance, the pessimistic placement.
    """
    if reading_instances is None:
        reading_instances = readers_per_event
    cores = limits.get("cores_per_instance", 2)
    memory_gb = limits.get("memory_gb_per_instance", 4)
    fds = limits.get("fds_per_worker", 20_000) * cores
    utilisation = limits.get("utilisation", 0.6)  # headroom for bursts and a lost instance
    deliveries = events_per_second * readers_per_event
    publish_ms = unit["server_cpu_us_per_batched_event"] / 1000 if batched else unit["server_cpu_ms_per_publish"]
    redis_publish_us = unit["redis_cpu_us_per_batched_event" if batched else "redis_cpu_us_per_publish"]
    server_cpu = (
        events_per_second * publish_ms / 1000
        + deliveries * unit["server_cpu_us_per_delivery"] / 1e6
        + connections * unit["server_cpu_us_per_idle_connection_second"] / 1e6
    )
    instances = {
        "by_cpu": server_cpu / (cores * utilisation),
        "by_memory": connections * unit["rss_per_connection_kb"] / 1024 / 1024 / (memory_gb * 0.8),
        "by_descriptors": connections / (fds * 0.8),
    }
    redis_cpu = (
        events_per_second * (redis_publish_us + reading_instances * unit["redis_cpu_us_per_read_event"]) / 1e6
        + connections * unit["redis_commands_per_connection_second"] * limits.get("redis_us_per_command", 5) / 1e6
    )
    redis_commands = (
        events_per_second * unit["redis_commands_per_publish"]
        + connections * unit["redis_commands_per_connection_second"]
    )
    shards = {"by_cpu": redis_cpu / utilisation}  # one core per primary: Redis runs commands on one thread
    return {
        "connections": connections,
        "events_per_second": events_per_second,
        "readers_per_event": readers_per_event,
        "batched": batched,
        "server_cores": round(server_cpu, 2),
        "instances": {k: round(v, 2) for k, v in instances.items()},
        "instances_needed": max(1, -(-max(instances.values()) // 1)),
        "redis_cores": round(redis_cpu, 3),
        "redis_commands_per_second": round(redis_commands),
        "redis_out_bytes_per_second": round(
            events_per_second * reading_instances * unit["redis_out_bytes_per_read_event"]
        ),
        "shards": {k: round(v, 2) for k, v in shards.items()},
        "primaries_needed": int(max(1, -(-max(shards.values()) // 1))),
    }


# --- phase 2: the check on a local cluster ------------------------------------------------------------


def cluster_check(unit: dict, instances: int, users: int, per_user: int, events: int, rate: float) -> dict:
    """Several instances on a 3-primary cluster under a known load: what the model predicts, what happens."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = RedisClusterServer(Path(tmp) / "cluster")
        cluster.start()
        env = {
            **service_env(cluster, tmp),
            "REDIS_MODE": "cluster",
            "MAX_CONNECTIONS_PER_USER": "1000",
        }
        servers = [LiveServer(env, workers=1) for _ in range(instances)]
        try:
            with ThreadPoolExecutor(instances) as pool:
                list(pool.map(LiveServer.start, servers))
            return _cluster_check(unit, cluster, servers, env, users, per_user, events, rate)
        finally:
            for server in servers:
                server.stop()
            cluster.stop()


def _cluster_check(unit, cluster, servers, env, users, per_user, events, rate) -> dict:
    bases = [s.url for s in servers]
    pids = [pid for s in servers for pid in [s.process.pid, *s.worker_pids()]]
    primaries = [redis.Redis("127.0.0.1", port) for port in cluster.primaries()]
    accounts = make_users(bases, users)
    key = publisher_key(env)
    token = f"cap{os.getpid()}c"
    targets = [sse_target(base, user.auth) for base, user in accounts for _ in range(per_user)]
    streams = StreamFleet(targets[0], len(targets), token, expected=events // users, targets=targets)
    streams.open()
    time.sleep(1)
    before = (redis_reading(primaries), process_cpu(pids))
    seconds = publish_round_robin(bases, key, [u.channel for _, u in accounts], events, rate, token)
    delivered = sum(len(arrivals) for arrivals in streams.collect()[0])
    after = (redis_reading(primaries), process_cpu(pids))
    measured_redis = redis_delta(before[0], after[0])
    achieved = events / seconds
    predicted = model(unit, len(targets), achieved, per_user, reading_instances=1)  # a user's streams: one instance
    window = seconds
    return {
        "instances": len(servers),
        "primaries": len(primaries),
        "connections": len(targets),
        "events": events,
        "rate_achieved": round(achieved, 1),
        "deliveries_expected": events // users * len(targets),
        "deliveries": delivered,
        "predicted": {
            "server_cores": predicted["server_cores"],
            "redis_cores": predicted["redis_cores"],
            "redis_commands_per_second": predicted["redis_commands_per_second"],
        },
        "measured": {
            "server_cores": round((after[1] - before[1]) / window, 2),
            "redis_cores": round(measured_redis["cpu"] / window, 3),
            "redis_commands_per_second": round(measured_redis["commands"] / window),
            "commands_per_primary": [n["commands"] for n in measured_redis["nodes"]],
        },
    }


def run(
    users: int = 200,
    per_user: int = 5,
    events: int = 4000,
    rate: float = 2000,
    idle: float = 25,
    instances: int = 3,
    cluster: bool = True,
) -> dict:
    """Unit figures, the model for 1,000,000 connections and 50,000 events/s, and the check on a cluster."""
    unit = unit_figures(users, per_user, events, rate, idle)
    results = {"machine": machine(), "unit": unit}
    results["model"] = [
        model(unit, 1_000_000, 50_000, readers, batched)
        for batched in (False, True)
        for readers in (1, 2, 10)  # one device; a user's two devices; a room of ten
    ]
    if cluster:
        results["cluster_check"] = cluster_check(unit, instances, users, per_user, events, rate)
    return results


def table(results: dict) -> str:
    """The figures as markdown tables."""
    u = results["unit"]
    lines = [
        f"Unit figures: {u['connections']:,} SSE streams of {u['users']} users on one instance (2 workers), "
        f"{u['events']:,} events at {u['rate_achieved']}/s ({u['deliveries']:,} of {u['deliveries_expected']:,} "
        "deliveries).",
        "",
        "| per | figure |",
        "|---|---|",
        f"| open connection | {u['rss_per_connection_kb']} KB server memory, "
        f"{u['server_cpu_ms_per_connection_open']} ms server CPU to open, "
        f"{u['redis_commands_per_connection_open']} Redis commands to open |",
        f"| open connection, per second | {u['server_cpu_us_per_idle_connection_second']} us server CPU, "
        f"{u['redis_commands_per_connection_second']} Redis commands |",
        f"| event, one POST /events | {u['server_cpu_ms_per_publish']} ms server CPU, "
        f"{u['redis_commands_per_publish']} Redis commands, {u['redis_cpu_us_per_publish']} us Redis CPU |",
        f"| event, in batches of 100 | {u['server_cpu_us_per_batched_event']} us server CPU, "
        f"{u['redis_cpu_us_per_batched_event']} us Redis CPU |",
        f"| event read on an instance | {u['redis_out_bytes_per_read_event']} bytes from Redis, "
        f"{u['redis_cpu_us_per_read_event']} us Redis CPU |",
        f"| delivery to one stream | {u['server_cpu_us_per_delivery']} us server CPU |",
        f"| event kept in history | {u['redis_bytes_per_history_entry']} bytes of Redis memory |",
        "",
        "| 1,000,000 connections, 50,000 events/s | readers per event | server cores | instances "
        "(CPU / memory / descriptors) | Redis cores | primaries |",
        "|---|---|---|---|---|---|",
    ]
    for m in results["model"]:
        i = m["instances"]
        lines.append(
            f"| {'batches of 100' if m['batched'] else 'one request per event'} | {m['readers_per_event']} | "
            f"{m['server_cores']} | {m['instances_needed']:.0f} ({i['by_cpu']} / {i['by_memory']} / "
            f"{i['by_descriptors']}) | {m['redis_cores']} | {m['primaries_needed']} |"
        )
    check = results.get("cluster_check")
    if check:
        p, m = check["predicted"], check["measured"]
        lines += [
            "",
            f"Check: {check['instances']} instances (1 worker each) on {check['primaries']} primaries, "
            f"{check['connections']:,} streams, {check['events']:,} events at {check['rate_achieved']}/s "
            f"({check['deliveries']:,} of {check['deliveries_expected']:,} deliveries).",
            "",
            "| | predicted | measured |",
            "|---|---|---|",
            f"| server cores | {p['server_cores']} | {m['server_cores']} |",
            f"| Redis cores (all primaries) | {p['redis_cores']} | {m['redis_cores']} |",
            f"| Redis commands/s | {p['redis_commands_per_second']:,} | {m['redis_commands_per_second']:,} "
            f"(per primary: {', '.join(f'{c:,}' for c in m['commands_per_primary'])} in all) |",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--per-user", type=int, default=5)
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=2000, help="asked publish rate (the service's limit if lower)")
    parser.add_argument("--idle", type=float, default=25, help="seconds of idle connections measured")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args()
    results = run(args.users, args.per_user, args.events, args.rate, args.idle, args.instances, not args.no_cluster)
    results["command"] = "python -m bench.capacity_model " + " ".join(sys.argv[1:])
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
