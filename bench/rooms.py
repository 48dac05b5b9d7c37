"""Channels at scale (docs/api.md, Channels), beside nginx+nchan in the same run.

- rooms: R channels x K SSE subscribers (one user per stream, an `authenticated` namespace), one event per
  channel per second for S seconds: publish-to-receive p50/p99 and server memory per subscriber; nchan with
  the same channels (a subscriber and a publisher location per channel id).
- storm: U users join one presence channel (join_leave, or presence alone) within W seconds: the time until
  GET /channels/{c}/presence counts them all, and a watcher's presence.join events, exactly once per user;
  then every user leaves: the same for presence.leave.
- subscriptions: C connections reading 1 channel, then C reading 100 (fresh servers): server memory per
  subscription beyond a connection's first (nchan: one multiplexed subscriber location); Redis commands
  per subscription, from INFO commandstats, and per WebSocket subscribe frame.
- keep: the broadcast figures of `make bench` (10,000 SSE streams: p99, memory per stream; sustained
  deliveries/s to 1,000 streams), on this tree and on another checkout (--base), with nchan's;
  cpu: the workers' CPU time per delivery alone, on both.

Every event carries the time its publish request was written and the time it fell due
(`token|room|n|sent|due;`), so a latency is publish to receive whatever the publisher's pace, and due to
receive counts the publisher's queue too. Both systems take one request per event (the service
POST /events with an API key, nchan POST /pub/<id>); with --batch the service takes what falls due in each
50 ms in one POST /events/batch.

Run: .venv/bin/python -m bench.rooms [--quick] [--parts rooms,storm,subscriptions,keep,cpu] [--seconds 30]
     [--batch] [--storm-users 5000] [--storm-window 10] [--no-join-leave] [--diff] [--base /tmp/base] [--repeat N]
Writes bench/results/rooms.json (each run with its command, time and load average) and rooms.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import logging
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench.common import machine, percentile
from bench.streams import Target, answered, open_stream, raise_fd_limit
from bench.targets import Nchan, Service, rss_bytes, shared_redis
from tests.servers import wait_until

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NCHAN_MODULE = "/usr/lib/nginx/modules/ngx_nchan_module.so"
BATCH_INTERVAL = 0.05  # seconds: the service's publisher sends what fell due in each, in one batch
OPEN_CONCURRENCY = 100
CLIENT_PROCESSES = 2  # one per core; each reads at most 8,000 streams


def load() -> str:
    """The load average (1, 5, 15 minutes), as uptime prints it, and the share of the last minute in which
    some runnable process waited for a core (the kernel's CPU pressure), when the kernel tells."""
    text = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    with contextlib.suppress(OSError, ValueError, IndexError):
        some = Path("/proc/pressure/cpu").read_text().split("\n")[0].split()
        text += f" (CPU pressure {float(some[2].split('=')[1]):.0f} %)"
    return text


def connections_per_worker(worker_pids: list[int], port: int, exclude_streams: bool = False) -> list[int]:
    """How many established connections to `port` each worker holds, most first (from `ss`). With
    `exclude_streams`, only those from 127.0.0.1 (the publisher's; the readers come from 127.0.2.x)."""
    output = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, check=True
    ).stdout
    lines = [
        line for line in output.splitlines() if not exclude_streams or line.split()[3].startswith("127.0.0.1:")
    ]  # the columns: Recv-Q, Send-Q, local address, peer address, process
    text = "\n".join(lines)
    return sorted((len(re.findall(rf"pid={pid},", text)) for pid in worker_pids), reverse=True)


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of these processes so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def quiet_cpu(pids, limit: float = 30.0) -> float:
    """The CPU time of `pids()` once they have gone quiet (not a clock tick of CPU in a quarter of a second), or
    after `limit` seconds: with the time before, what a server spends on the streams its clients have closed."""
    deadline = time.monotonic() + limit
    before = cpu_seconds(pids())
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = cpu_seconds(pids())
        if now - before < 0.005:
            return now
        before = now
    return before


def redis_cpu_seconds(client) -> float:
    """User and system CPU time of the Redis server so far (its INFO)."""
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def redis_reading(client) -> dict:
    info = client.info("all")
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in info.items() if k.startswith("cmdstat_")}
    return {
        "calls": calls,
        "cpu": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        "memory": int(info["used_memory"]),
    }


def redis_delta(before: dict, after: dict) -> dict:
    """Commands (all but INFO and PING; those run inside scripts count too), CPU and memory between readings."""
    calls = {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items() if k not in {"info", "ping"}}
    calls = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v}
    return {
        "commands": sum(calls.values()),
        "by_command": calls,
        "cpu_seconds": round(after["cpu"] - before["cpu"], 3),
        "memory_bytes": after["memory"] - before["memory"],
    }


# ---------------------------------------------------------------------------------------------------------
# Users, namespaces and the systems


def mint_users(env: dict, count: int) -> list[tuple[str, str]]:
    """`count` users with a session and an access token each, written straight into the service's Redis:
    logging in 10,000 users through Argon2 would take minutes and measure nothing of interest here."""
    from app import create_app
    from app.auth.sessions import start_session
    from app.auth.tokens import issue_access_token
    from app.auth.users import create_user

    users = []
    stamp = uuid.uuid4().hex[:8]
    with create_app(env).app_context():
        logging.getLogger("audit").disabled = True  # in this process: no log line per user made
        for n in range(count):
            user = create_user(f"room-{stamp}-{n}@example.com", None)
            session = start_session(user["id"], "bench", "127.0.0.1")
            token = issue_access_token(user["id"], user["role"], int(user["token_version"]), session.session_id)
            users.append((user["id"], token))
    return users


def manager_key(env: dict) -> str:
    """An API key that manages channels and publishes anywhere."""
    from app import create_app
    from app.apikeys.store import create_key

    with create_app(env).app_context():
        key, _ = create_key("bench rooms", ["events:publish", "channels:manage"], ["*"])
    return key


def put_namespace(service: Service, key: str, name: str, **rules) -> None:
    body = {"subscribe": "authenticated", "publish": "server", **rules}
    answer = requests.put(
        f"{service.app.url}/admin/namespaces/{name}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    answer.raise_for_status()


def room_readers(service: Service, channel_lists: list[list[str]]) -> tuple[str, list[Target]]:
    """The `rooms` namespace (open to signed-in users), a manager key, and one user per list, each with a
    stream reading that list's channels: the key and the streams' targets."""
    key = manager_key(service.app.env)
    put_namespace(service, key, "rooms")
    users = mint_users(service.app.env, len(channel_lists))
    targets = [
        Target(
            "service",
            "127.0.0.1",
            service.app.port,
            "/events/stream?channels=" + ",".join(channels),
            {"Authorization": f"Bearer {token}"},
            opened_when=b"stream open",
        )
        for (_, token), channels in zip(users, channel_lists, strict=True)
    ]
    return key, targets


class RoomsNchan(Nchan):
    """nginx+nchan with a channel per path: /sub/<id> (EventSource), /pub/<id>, and /multi?channels=a,b
    (one subscriber multiplexing several channels)."""

    SITE = (
        "server {\n    listen ${NGINX_PORT};\n    keepalive_requests 1000000;\n"
        "    location ~ ^/sub/([A-Za-z0-9_]+)$ { nchan_subscriber eventsource; nchan_channel_id $1; }\n"
        '    location = /multi { nchan_subscriber eventsource; nchan_channel_id_split_delimiter ",";'
        " nchan_channel_id $arg_channels; }\n"
        "    location ~ ^/pub/([A-Za-z0-9_]+)$ { nchan_publisher; nchan_channel_id $1;"
        " nchan_message_buffer_length 10; }\n"
        "    location = /healthz { return 200 'ok'; }\n}\n"
    )


# ---------------------------------------------------------------------------------------------------------
# Client processes


def _source(index: int) -> tuple[str, int]:
    """A loopback source address of its own for client process `index` (ports: about 28,000 per address)."""
    return (f"127.0.2.{index + 1}", 0)


async def _open_all(targets: list[Target], source, gate_size: int = OPEN_CONCURRENCY):
    gate = asyncio.Semaphore(gate_size)
    failures: dict[str, int] = {}

    async def one(target: Target):
        async with gate:
            try:
                return await asyncio.wait_for(open_stream(target, source), 60)
            except (TimeoutError, OSError, RuntimeError, asyncio.IncompleteReadError) as error:
                failures[str(error)[:60] or type(error).__name__] = failures.get(str(error)[:60], 0) + 1
                return None

    return await asyncio.gather(*(one(t) for t in targets)), failures


def quiet_collector() -> None:
    """No cyclic garbage collection in this client process until `gc.enable()`: what it holds (and, forked, what
    the driver held) moved out of the collector's reach first. Its full collections paused a reader 150-410 ms
    (its younger ones 15-47 ms every 1.7 s), and every event arriving meanwhile counted as late: the rooms run's
    p99 was the readers' collector, for nchan as for the service."""
    gc.collect()
    gc.freeze()
    gc.disable()


def _room_reader(specs, token, expected, ready, go, results, index) -> None:
    """Open `specs` (Target, room) streams, report, then read until every stream has `expected` events of
    its room or the deadline that `go` sends passes, report, and close them when `go` says so (the server's
    CPU for ending streams is measured apart from the publishing's). Latencies are measured from the `sent`
    in each event."""
    raise_fd_limit()
    pattern = re.compile(re.escape(token.encode()) + rb"\|(\d+)\|(\d+)\|([\d.]+)\|([\d.]+);")

    async def main():
        streams, failures = await _open_all([t for t, _ in specs], _source(index))
        quiet_collector()  # before the publishing starts: a last collection takes a while
        ready.put({"opened": sum(s is not None for s in streams), "failures": failures})
        deadline = await asyncio.get_running_loop().run_in_executor(None, go.get)
        latencies: list[float] = []
        from_due: list[float] = []
        verdicts = []
        cpu_before = os.times()

        async def read(stream, room: int):
            seen, last, verdict = set(), -1, {"duplicates": 0, "out_of_order": 0, "foreign": 0, "closed": False}
            verdicts.append((verdict, seen))
            window = b""
            while len(seen) < expected:
                data = await stream.read()
                if not data:
                    verdict["closed"] = True
                    return
                now = time.time()
                window += data
                end = 0
                for match in pattern.finditer(window):
                    end = match.end()
                    if int(match[1]) != room:
                        verdict["foreign"] += 1
                        continue
                    n = int(match[2])
                    latencies.append(now - float(match[3]))
                    from_due.append(now - float(match[4]))
                    if n in seen:
                        verdict["duplicates"] += 1
                    if n < last:
                        verdict["out_of_order"] += 1
                    seen.add(n)
                    last = max(last, n)
                window = window[end:][-200:]

        tasks = [
            asyncio.ensure_future(read(s, room)) for s, (_, room) in zip(streams, specs, strict=True) if s is not None
        ]
        if tasks:
            await asyncio.wait(tasks, timeout=max(1.0, deadline - time.time()))
        cpu_after = os.times()
        gc.enable()
        for task in tasks:
            task.cancel()
        missing = sum(expected - len(seen) for _, seen in verdicts)
        totals = {k: sum(v[k] for v, _ in verdicts) for k in ("duplicates", "out_of_order", "foreign", "closed")}
        complete = sum(1 for v, seen in verdicts if len(seen) == expected and not v["duplicates"])
        cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        results.put(
            {
                "latencies": latencies,
                "from_due": from_due,
                "missing": missing,
                "complete": complete,
                "cpu": cpu,
                **totals,
            }
        )
        await asyncio.get_running_loop().run_in_executor(None, go.get)
        for stream in streams:
            if stream is not None:
                stream.writer.close()
        await asyncio.sleep(0)  # the closes reach the sockets
        results.put({"closed": True})

    asyncio.run(main())


def _holder(targets, start_at, spacing, ready, close, results, index) -> None:
    """Open `targets`, the i-th at start_at + i * spacing (spacing 0: as fast as OPEN_CONCURRENCY allows),
    read and drop what arrives until `close` is set, then close every stream. Reports each open's time."""
    raise_fd_limit()

    async def main():
        opened, failures, open_times = [], {}, []
        gate = asyncio.Semaphore(OPEN_CONCURRENCY if spacing == 0 else len(targets) or 1)

        async def one(i: int, target: Target):
            delay = start_at + i * spacing - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                began = time.time()
                try:
                    stream = await asyncio.wait_for(open_stream(target, _source(index)), 60)
                except (TimeoutError, OSError, RuntimeError, asyncio.IncompleteReadError) as error:
                    key = str(error)[:60] or type(error).__name__
                    failures[key] = failures.get(key, 0) + 1
                    return
                open_times.append((began, time.time()))
                opened.append(stream)
            while True:  # drop what arrives, so the server is never held up by this reader
                if not await stream.reader.read(262144):
                    return

        tasks = [asyncio.ensure_future(one(i, t)) for i, t in enumerate(targets)]
        while len(opened) + sum(failures.values()) < len(targets):
            await asyncio.sleep(0.05)
        ready.put({"opened": len(opened), "failures": failures, "open_times": open_times})
        await asyncio.get_running_loop().run_in_executor(None, close.wait)
        closing_at = time.time()
        for stream in opened:
            stream.writer.close()
        await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        results.put({"closing_at": closing_at})

    asyncio.run(main())


def _watcher(target: Target, own: str, users: list[str], joined, left, results, stop, index) -> None:
    """One SSE stream of the presence channel: when each presence.join and presence.leave arrives, per user.
    Sets `joined` once every user of `users` joined, `left` once every one left (`own`: the watcher's id)."""
    raise_fd_limit()
    wanted = set(users)
    data_line = re.compile(rb'\ndata: (\{"id".*?)\n')

    async def main():
        stream = await open_stream(target, _source(index))
        ready_at = time.time()
        joins: dict[str, list[float]] = {}
        leaves: dict[str, list[float]] = {}
        sequence: dict[str, list[str]] = {}  # per user, j and l in the order they arrived
        others = {"join": 0, "leave": 0, "other": 0}
        window = b"\n"

        async def read():
            nonlocal window
            while True:
                data = await stream.read()
                if not data:
                    return
                now = time.time()
                window += data
                end = 0
                for match in data_line.finditer(window):
                    end = match.end() - 1
                    for book, user in _presence_changes(json.loads(match[1]), joins, leaves):
                        if book is None:
                            others["other"] += 1
                        elif user == own:
                            continue
                        elif user not in wanted:
                            others["join" if book is joins else "leave"] += 1
                        else:
                            book.setdefault(user, []).append(now)
                            sequence.setdefault(user, []).append("j" if book is joins else "l")
                            if book is joins and len(joins) == len(wanted):
                                joined.set()
                            if book is leaves and len(leaves) == len(wanted):
                                left.set()
                window = window[end:]

        task = asyncio.ensure_future(read())
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        task.cancel()
        stream.writer.close()
        results.put({"ready_at": ready_at, "joins": joins, "leaves": leaves, "others": others, "sequence": sequence})

    asyncio.run(main())


def _presence_changes(event: dict, joins: dict, leaves: dict) -> list[tuple[dict | None, str | None]]:
    """(the book it goes in, user id) for each join and leave an event says (a presence.diff says many);
    (None, None) for any other event."""
    kind, data = event["event"], event.get("data")
    if kind == "presence.diff":
        return [(leaves, m["user_id"]) for m in data["leaves"]] + [(joins, m["user_id"]) for m in data["joins"]]
    if kind in ("presence.join", "presence.leave") and isinstance(data, dict):
        return [(joins if kind == "presence.join" else leaves, data.get("user_id"))]
    return [(None, None)]


# ---------------------------------------------------------------------------------------------------------
# The publisher: asyncio, raw keep-alive connections, the send time written into each event


async def publish_rooms(
    system: str, port: int, key: str | None, token: str, rooms: int, seconds: int, batch: bool = False, at_end=None
) -> dict:
    """Room r's event n falls due at start + n + r / rooms. Room r is published on connection r % connections
    only, one request after the other, so each room's events are published in order. One POST /events (nchan:
    POST /pub/<id>) per event on 16 connections; with `batch`, the service takes what fell due for a
    connection's rooms (at most 100) in one POST /events/batch every 50 ms, on 4 connections. Returns the pace
    achieved and how late the sends were (how far the publisher fell behind its schedule). `at_end` is called
    (in a thread) a second after the last answer, while the connections are still open."""
    batching = batch and system == "service"
    connections = 4 if batching else 16
    queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(connections)]
    lateness: list[float] = []
    first = time.time() + 0.2
    sent_last = first
    finished, all_sent, closing = [0], asyncio.Event(), asyncio.Event()

    def request(items: list[tuple[int, int, float]]) -> bytes:
        sent = time.time()
        lateness.extend(sent - due for _, _, due in items)
        data = [f"{token}|{r}|{n}|{sent:.6f}|{due:.6f};" for r, n, due in items]
        if system == "service":
            events = [
                {"channel": f"rooms:r{r}", "event": "m", "data": text}
                for (r, _, _), text in zip(items, data, strict=True)
            ]
            body = json.dumps({"events": events} if batching else events[0]).encode()
            path = "/events/batch" if batching else "/events"
            extra = f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        else:
            body = data[0].encode()
            path = f"/pub/r{items[0][0]}"
            extra = ""
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        ).encode() + body

    async def sender(queue: asyncio.Queue):
        nonlocal sent_last
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while True:
            items = [await queue.get()]
            while batching and len(items) < 100 and items[-1] is not None and not queue.empty():
                items.append(queue.get_nowait())
            if items[-1] is None:
                items.pop()
                if items:  # the last ones, then stop
                    writer.write(request(items))
                    sent_last = max(sent_last, time.time())
                    await answered(reader)
                finished[0] += 1
                if finished[0] == connections:
                    all_sent.set()
                await closing.wait()
                writer.close()
                return
            writer.write(request(items))
            sent_last = max(sent_last, time.time())
            if not await answered(reader):
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)

    senders = [asyncio.ensure_future(sender(queue)) for queue in queues]
    schedule = [(first + n + r / rooms, r, n) for n in range(seconds) for r in range(rooms)]
    position, tick = 0, BATCH_INTERVAL if batching else 0.005
    while position < len(schedule):
        now = time.time()
        due = []
        while position < len(schedule) and schedule[position][0] <= now:
            at, r, n = schedule[position]
            due.append((r, n, at))
            position += 1
        for item in due:
            queues[item[0] % connections].put_nowait(item)
        await asyncio.sleep(tick)
    for queue in queues:
        queue.put_nowait(None)
    await all_sent.wait()
    if at_end is not None:
        await asyncio.sleep(1)  # the readers have read the last events
        await asyncio.get_running_loop().run_in_executor(None, at_end)
    closing.set()
    await asyncio.gather(*senders)
    return {
        "events": len(schedule),
        "achieved_rate": round(len(schedule) / (sent_last - first), 1),
        "send_late_p50_ms": round(statistics.median(lateness) * 1000, 1),
        "send_late_p99_ms": round(percentile(lateness, 0.99) * 1000, 1),
        "publish_seconds": round(sent_last - first, 2),
    }


# ---------------------------------------------------------------------------------------------------------
# Part 1: many small rooms


def _share(items: list, processes: int) -> list[list]:
    return [items[i::processes] for i in range(processes)]


def rooms_run(
    system_name: str,
    system,
    targets: list[Target],
    per_stream_rooms: list[int],
    pids,
    port: int,
    key: str | None,
    seconds: int,
    redis_client=None,
    batch: bool = False,
    worker_pids=None,
    when_open=None,
    when_read=None,
) -> dict:
    """Open the streams, read the footprint, publish one event per room per second, collect, close the streams.
    Halfway through the publishing, the machine's load; after it (given `worker_pids`), how the publisher's
    connections sat on the workers. `when_open` and `when_read` are called when the streams are open and when
    every reader has read, before they close."""
    context = multiprocessing.get_context("fork")
    token = uuid.uuid4().hex[:12]
    specs = list(zip(targets, per_stream_rooms, strict=True))
    rooms = len(set(per_stream_rooms))
    baseline = rss_bytes(pids())
    redis_before = redis_reading(redis_client) if redis_client else None
    ready, results = context.Queue(), context.Queue()
    gos = [context.Queue() for _ in range(CLIENT_PROCESSES)]
    workers = [
        context.Process(target=_room_reader, args=(share, token, seconds, ready, gos[i], results, i), daemon=True)
        for i, share in enumerate(_share(specs, CLIENT_PROCESSES))
    ]
    started, open_cpu_before = time.perf_counter(), cpu_seconds(pids())
    for worker in workers:
        worker.start()
    reports = [ready.get(timeout=600) for _ in workers]
    open_seconds = time.perf_counter() - started
    open_cpu = cpu_seconds(pids()) - open_cpu_before
    opened = sum(r["opened"] for r in reports)
    failures: dict = {}
    for r in reports:
        for k, v in r["failures"].items():
            failures[k] = failures.get(k, 0) + v
    time.sleep(1.0)
    idle = rss_bytes(pids())
    redis_idle = redis_reading(redis_client) if redis_client else None
    if when_open is not None:
        when_open()
    quiet_collector()  # the publisher's: a pause of its own would count as the server answering late
    deadline = time.time() + seconds + 30  # the publishing period, then 30 s for stragglers
    for go in gos:
        go.put(deadline)
    cpu_before = cpu_seconds(pids())
    redis_cpu_before = redis_cpu_seconds(redis_client) if redis_client else None
    during: dict = {}

    def halfway():
        time.sleep(seconds / 2)
        during["load"] = load()

    def spread() -> None:  # after the publishing: `ss` over 10,000 streams stalled every process for a moment
        if worker_pids is not None:
            during["publisher_connections_per_worker"] = connections_per_worker(
                worker_pids(), port, exclude_streams=True
            )

    sampler = threading.Thread(target=halfway, daemon=True)
    sampler.start()
    try:
        published = asyncio.run(publish_rooms(system_name, port, key, token, rooms, seconds, batch, spread))
    finally:
        gc.unfreeze()
        gc.enable()
    sampler.join()
    collected = [results.get(timeout=seconds + 120) for _ in workers]
    cpu_after = cpu_seconds(pids())
    after = rss_bytes(pids())
    if when_read is not None:
        when_read()
    close_cpu_before = cpu_seconds(pids())
    for go in gos:
        go.put("close")
    for _ in workers:
        results.get(timeout=60)
    close_cpu = quiet_cpu(pids) - close_cpu_before
    for worker in workers:
        worker.join(10)
    latencies = [x for c in collected for x in c["latencies"]]
    from_due = [x for c in collected for x in c["from_due"]]
    result = {
        "system": system_name,
        "rooms": rooms,
        "streams": len(targets),
        "opened": opened,
        "open_failures": failures,
        "open_seconds": round(open_seconds, 2),
        "open_server_cpu_seconds": round(open_cpu, 2),
        "seconds": seconds,
        "rss_per_subscriber_kb": round((idle - baseline) / max(opened, 1) / 1024, 2),
        "rss_per_subscriber_after_traffic_kb": round((after - baseline) / max(opened, 1) / 1024, 2),
        "server_rss_mb": round(after / 2**20, 1),
        "publish": {**published, "one_request_per_event": not (batch and system_name == "service")},
        "load_during": during.get("load"),
        **({"publisher_connections_per_worker": during["publisher_connections_per_worker"]} if worker_pids else {}),
        "deliveries": len(latencies),
        "expected_deliveries": opened * seconds,
        "latency_p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "latency_p99_ms": round(percentile(latencies, 0.99) * 1000, 1) if latencies else None,
        "latency_max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "due_to_receive_p50_ms": round(statistics.median(from_due) * 1000, 1) if from_due else None,
        "due_to_receive_p99_ms": round(percentile(from_due, 0.99) * 1000, 1) if from_due else None,
        "missing": sum(c["missing"] for c in collected) + (len(targets) - opened) * seconds,
        "duplicates": sum(c["duplicates"] for c in collected),
        "out_of_order": sum(c["out_of_order"] for c in collected),
        "foreign": sum(c["foreign"] for c in collected),
        "closed_by_server": sum(c["closed"] for c in collected),
        "complete_streams": sum(c["complete"] for c in collected),
        "server_cpu_seconds": round(cpu_after - cpu_before, 2),
        "close_server_cpu_seconds": round(close_cpu, 2),
        "client_cpu_seconds": round(sum(c["cpu"] for c in collected), 2),
    }
    if redis_client:  # beside the server's: Redis is the service's too, and nchan has none
        result["redis_cpu_seconds"] = round(redis_cpu_seconds(redis_client) - redis_cpu_before, 2)
    if redis_client:
        result["redis_idle"] = {
            "memory_per_subscriber_bytes": round((redis_idle["memory"] - redis_before["memory"]) / max(opened, 1))
        }
        result["redis_during"] = redis_delta(redis_idle, redis_reading(redis_client))
        result["redis_during"].pop("by_command")
    print(json.dumps({k: v for k, v in result.items()}), flush=True)
    return result


def part_rooms(
    redis_server, rooms: int, per_room: int, seconds: int, batch: bool = False, base: Path | None = None
) -> dict:
    """The service (this tree, then the checkout `base` if given) and nchan, one after the other."""
    count = rooms * per_room
    per_stream_rooms = [n // per_room for n in range(count)]
    out = {"load_before": load()}
    for name, root in [("service", None)] + ([("base", base)] if base else []):
        service = _started(redis_server, root)
        try:
            key, targets = room_readers(service, [[f"rooms:r{room}"] for room in per_stream_rooms])
            out[name] = rooms_run(
                "service",
                service,
                targets,
                per_stream_rooms,
                service.server_pids,
                service.app.port,
                key,
                seconds,
                redis_server.client(),
                batch,
                service.app.worker_pids,
            )
        finally:
            service.__exit__(None, None, None)
        redis_server.client().flushall()  # the next service makes its users again
    out["load_between"] = load()
    with RoomsNchan() as nchan:
        targets = [
            Target("nchan", "127.0.0.1", nchan.port, f"/sub/r{room}", opened_when=b"\n\n") for room in per_stream_rooms
        ]
        out["nchan"] = rooms_run(
            "nchan", nchan, targets, per_stream_rooms, nchan.server_pids, nchan.port, None, seconds
        )
    out["load_after"] = load()
    return out


# ---------------------------------------------------------------------------------------------------------
# Part 2: a join storm


POLL_INTERVAL = 0.5  # seconds between two GET presence: each lists up to 1,000 users (a Redis script)


def twice(sequence: list[str], kind: str) -> int:
    """How often `kind` (j or l) came right after another `kind` of the same user, with nothing between."""
    return sum(1 for a, b in zip(sequence, sequence[1:], strict=False) if a == b == kind)


def part_storm(
    redis_server, users_count: int, window: float, hold: float = 30.0, join_leave: bool = True, diff: bool = False
) -> dict:
    """`users_count` users open an SSE stream of one presence channel, evenly over `window` seconds; without
    `join_leave` the namespace keeps presence but publishes no join or leave events (the count alone); with
    `diff` (a presence_diff namespace) they go out together as presence.diff events."""
    context = multiprocessing.get_context("fork")
    channel = "lobby:storm"
    out = {"users": users_count, "window_seconds": window, "join_leave": join_leave, "load_before": load()}
    out["presence_diff"] = diff
    with Service(redis_server) as service:
        key = manager_key(service.app.env)
        rules = {"presence_diff": True} if diff else {}
        put_namespace(service, key, "lobby", presence=True, join_leave=join_leave, **rules)
        users = mint_users(service.app.env, users_count + 1)
        (watcher_id, watcher_token), stormers = users[0], users[1:]
        path = f"/events/stream?channels={channel}"

        def target(token):
            return Target(
                "service",
                "127.0.0.1",
                service.app.port,
                path,
                {"Authorization": f"Bearer {token}"},
                opened_when=b"stream open",
            )

        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {key}"

        errors: dict[str, int] = {}
        answer_times: list[float] = []

        def count() -> int:
            """The presence count (-1 when the answer is an error, which is counted by its status and text)."""
            began = time.time()
            answer = http.get(f"{service.app.url}/channels/{channel}/presence", timeout=30)
            answer_times.append(time.time() - began)
            if answer.status_code == 200:
                return answer.json()["count"]
            error = f"{answer.status_code} {answer.text[:200]}"
            errors[error] = errors.get(error, 0) + 1
            if errors[error] == 1:
                print(f"GET presence answered {error}", file=sys.stderr, flush=True)
            return -1

        joined, left, stop = context.Event(), context.Event(), context.Event()
        watch_results = context.Queue()
        watcher = context.Process(
            target=_watcher,
            args=(target(watcher_token), watcher_id, [u for u, _ in stormers], joined, left, watch_results, stop, 9),
            daemon=True,
        )
        watcher.start()
        wait_until(lambda: count() == 1, timeout=30, message="the watcher present")
        redis = redis_server.client()
        redis_before = redis_reading(redis)
        ready, results, close = context.Queue(), context.Queue(), context.Event()
        start_at = time.time() + 1.0
        spacing = window / users_count
        shares = _share([target(t) for _, t in stormers], CLIENT_PROCESSES)
        holders = [
            context.Process(
                target=_holder,
                args=(share, start_at + i * spacing, spacing * CLIENT_PROCESSES, ready, close, results, i),
                daemon=True,
            )
            for i, share in enumerate(shares)
        ]
        for holder in holders:
            holder.start()
        # The count, polled every 100 ms until it is right (or 120 s passed).
        counted_at, counts, polls = None, [], 0
        while time.time() < start_at + window + 120:
            now, seen = time.time(), count()
            counts.append((round(now - start_at, 2), seen))
            polls += 1
            if seen == users_count + 1:
                counted_at = now
                break
            time.sleep(POLL_INTERVAL)
        opened = [ready.get(timeout=300) for _ in holders]
        all_opened_at = max((t[1] for o in opened for t in o["open_times"]), default=float("nan"))
        if join_leave:
            joined.wait(timeout=max(1.0, start_at + window + 120 - time.time()))
        joins_done_at = time.time() if joined.is_set() else None
        redis_joined = redis_reading(redis)
        snapshot_before = redis_reading(redis)
        count()
        snapshot_cost = redis_delta(snapshot_before, redis_reading(redis))["commands"]
        # Held a while: lease renewals (every fifth of PRESENCE_TIMEOUT_SECONDS) must publish nothing.
        time.sleep(max(0.0, start_at + hold - time.time()))
        count_held = count()
        rss_held = rss_bytes(service.server_pids())
        close.set()
        closed_at = min(results.get(timeout=60)["closing_at"] for _ in holders)
        left_count_at = None
        while time.time() < closed_at + 90:
            if count() == 1:
                left_count_at = time.time()
                break
            time.sleep(POLL_INTERVAL)
        if join_leave:
            left.wait(timeout=max(1.0, closed_at + 90 - time.time()))
        leaves_done_at = time.time() if left.is_set() else None
        time.sleep(2.0)  # anything published twice arrives by now
        stop.set()
        seen = watch_results.get(timeout=60)
        watcher.join(10)
        for holder in holders:
            holder.join(10)
        out["load_after"] = load()
    storm_ids = [u for u, _ in stormers]
    joins, leaves = seen["joins"], seen["leaves"]
    open_latency = [b - a for o in opened for a, b in o["open_times"]]
    failures: dict = {}
    for o in opened:
        for k, v in o["failures"].items():
            failures[k] = failures.get(k, 0) + v
    join_times = sorted(t[0] for t in joins.values())
    out.update(
        {
            "opened": sum(o["opened"] for o in opened),
            "open_failures": failures,
            "open_p50_ms": round(statistics.median(open_latency) * 1000, 1) if open_latency else None,
            "open_p99_ms": round(percentile(open_latency, 0.99) * 1000, 1) if open_latency else None,
            "last_open_s": round(all_opened_at - start_at, 2),
            "count_right_s": round(counted_at - start_at, 2) if counted_at else None,
            "count_timeline": counts[:: max(1, len(counts) // 40)],
            "presence_errors": errors,
            "count_while_held": count_held,
            "joins_all_s": round(joins_done_at - start_at, 2) if joins_done_at else None,
            "last_join_arrived_s": round(join_times[-1] - start_at, 2) if join_times else None,
            "joins_missing": sum(1 for u in storm_ids if u not in joins),
            "joins_duplicated": sum(twice(seen["sequence"].get(u, []), "j") for u in storm_ids),
            "rejoins": sum(seq.count("j") - 1 for seq in seen["sequence"].values() if seq.count("j") > 1),
            "joins_other_users": seen["others"]["join"],
            "leaves_before_close": sum(1 for u in leaves for t in leaves[u] if t < closed_at),
            "leave_count_right_s": round(left_count_at - closed_at, 2) if left_count_at else None,
            "leaves_all_s": round(leaves_done_at - closed_at, 2) if leaves_done_at else None,
            "leaves_missing": sum(1 for u in storm_ids if u not in leaves),
            "leaves_duplicated": sum(twice(seen["sequence"].get(u, []), "l") for u in storm_ids),
            "presence_get_p50_ms": round(statistics.median(answer_times) * 1000, 1),
            "presence_get_max_ms": round(max(answer_times) * 1000, 1),
            "presence_polls": polls,
            "redis_commands_per_presence_get": snapshot_cost,
            "server_rss_held_mb": round(rss_held / 2**20, 1),
            "redis_during_joins": redis_delta(redis_before, redis_joined),
        }
    )
    polling = out["presence_polls"] * out["redis_commands_per_presence_get"]  # the count's own cost, less
    out["redis_commands_per_join"] = round((out["redis_during_joins"]["commands"] - polling) / users_count, 1)
    out["redis_during_joins"]["by_command"] = dict(list(out["redis_during_joins"]["by_command"].items())[:8])
    print(json.dumps({k: v for k, v in out.items() if k != "count_timeline"}), flush=True)
    return out


# ---------------------------------------------------------------------------------------------------------
# Part 3: what a subscription beyond a connection's first costs


def channel_lists(connections: int, per_connection: int, pool: int) -> list[list[int]]:
    """Connection i reads channels i, i + step, ... of a pool of `pool` (each channel read as evenly)."""
    step = max(1, pool // per_connection)
    return [[(i + k * step) % pool for k in range(per_connection)] for i in range(connections)]


def hold_and_measure(targets: list[Target], pids, redis_client=None) -> dict:
    """Open `targets` on a fresh server, read its footprint (and Redis's commands while opening)."""
    context = multiprocessing.get_context("fork")
    baseline = rss_bytes(pids())
    if redis_client:
        idle_before = redis_reading(redis_client)
        time.sleep(5)
        idle_after = redis_reading(redis_client)
        idle_rate = redis_delta(idle_before, idle_after)["commands"] / 5
    before = redis_reading(redis_client) if redis_client else None
    ready, results, close = context.Queue(), context.Queue(), context.Event()
    started = time.time()
    holders = [
        context.Process(target=_holder, args=(share, 0, 0, ready, close, results, i), daemon=True)
        for i, share in enumerate(_share(targets, CLIENT_PROCESSES))
    ]
    for holder in holders:
        holder.start()
    reports = [ready.get(timeout=600) for _ in holders]
    open_seconds = time.time() - started
    after = redis_reading(redis_client) if redis_client else None
    time.sleep(1.0)
    rss = rss_bytes(pids())
    opened = sum(r["opened"] for r in reports)
    result = {
        "connections": len(targets),
        "opened": opened,
        "open_seconds": round(open_seconds, 2),
        "rss_per_connection_kb": round((rss - baseline) / max(opened, 1) / 1024, 2),
    }
    failures = [r["failures"] for r in reports if r["failures"]]
    if failures:
        result["open_failures"] = failures
    if redis_client:
        delta = redis_delta(before, after)
        result["redis_commands_per_connection"] = round(
            (delta["commands"] - idle_rate * open_seconds) / max(opened, 1), 2
        )
        result["redis_by_command_per_connection"] = {
            k: round(v / max(opened, 1), 2) for k, v in list(delta["by_command"].items())[:10]
        }
        result["redis_idle_commands_per_second"] = round(idle_rate, 1)
        # While held: what the open connections cost Redis each second (leases, renewals, heartbeats),
        # over 21 s: each worker renews its connection leases every 20 s.
        held_before = redis_reading(redis_client)
        time.sleep(21)
        held = redis_delta(held_before, redis_reading(redis_client))
        result["redis_commands_per_second_held"] = round(held["commands"] / 21, 1)
    close.set()
    for _ in holders:
        results.get(timeout=60)
    for holder in holders:
        holder.join(10)
    print(json.dumps(result), flush=True)
    return result


def ws_subscribe_cost(service: Service, key: str, users: list[tuple[str, str]], per_connection: int) -> dict:
    """Redis commands per WebSocket subscribe frame: each connection subscribes to `per_connection` channels
    one frame at a time (waiting for each answer), with INFO commandstats read around all of them."""
    import websocket

    sockets = []
    for _, token in users:
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{service.app.port}/ws", header=[f"Authorization: Bearer {token}"], timeout=30
        )
        while json.loads(ws.recv()).get("type") != "welcome":
            pass
        sockets.append(ws)
    client = service.redis.client()
    before = redis_reading(client)
    started = time.time()
    done = 0
    for i, ws in enumerate(sockets):
        for k in range(per_connection):
            ws.send(json.dumps({"type": "subscribe", "channel": f"ws:c{(i * 7 + k) % 1000}"}))
            while True:
                frame = json.loads(ws.recv())
                if frame.get("type") in ("subscribed", "error"):
                    break
            if frame["type"] != "subscribed":
                raise RuntimeError(frame)
            done += 1
    seconds = time.time() - started
    delta = redis_delta(before, redis_reading(client))
    for ws in sockets:
        ws.close()
    result = {
        "subscribes": done,
        "seconds": round(seconds, 2),
        "redis_commands_per_subscribe": round(delta["commands"] / done, 2),
        "redis_by_command_per_subscribe": {k: round(v / done, 2) for k, v in list(delta["by_command"].items())[:10]},
        "redis_cpu_us_per_subscribe": round(delta["cpu_seconds"] / done * 1e6, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def part_subscriptions(redis_server, connections: int, wide: int, pool: int = 1000) -> dict:
    out = {"connections": connections, "wide": wide, "pool": pool, "load_before": load()}
    for label, per in (("one", 1), ("wide", wide)):
        lists = channel_lists(connections, per, pool)
        with Service(redis_server) as service:
            _, targets = room_readers(service, [[f"rooms:c{c}" for c in channels] for channels in lists])
            out[f"service_{label}"] = hold_and_measure(targets, service.server_pids, service.redis.client())
        with RoomsNchan() as nchan:
            targets = [
                Target(
                    "nchan",
                    "127.0.0.1",
                    nchan.port,
                    "/multi?channels=" + ",".join(f"c{c}" for c in channels),
                    opened_when=b"\n\n",
                )
                for channels in lists
            ]
            out[f"nchan_{label}"] = hold_and_measure(targets, nchan.server_pids)
    for system in ("service", "nchan"):
        one, many = out[f"{system}_one"], out[f"{system}_wide"]
        out[f"{system}_per_extra_subscription_kb"] = round(
            (many["rss_per_connection_kb"] - one["rss_per_connection_kb"]) / (wide - 1), 3
        )
    one, many = out["service_one"], out["service_wide"]
    out["service_redis_commands_per_extra_subscription"] = round(
        (many["redis_commands_per_connection"] - one["redis_commands_per_connection"]) / (wide - 1), 2
    )
    with Service(redis_server) as service:
        key = manager_key(service.app.env)
        put_namespace(service, key, "ws")
        users = mint_users(service.app.env, 10)
        out["ws_frames"] = ws_subscribe_cost(service, key, users, min(wide, 100))
    out["load_after"] = load()
    return out


# ---------------------------------------------------------------------------------------------------------
# Part 4: the broadcast figures of `make bench`, on this tree and on a base checkout


def cpu_per_delivery(service: Service, streams: int = 1000, events: int = 1000, rate: float = 100) -> dict:
    """The workers' CPU time per delivered event while `streams` streams receive `events` broadcasts at `rate`
    (a pace both trees keep up with): what the wall-clock figures show only through the machine's load."""
    from bench.run import PUBLISHERS, publish_paced
    from bench.streams import StreamFleet

    token = f"cpu-{uuid.uuid4().hex}"
    fleet = StreamFleet(
        service.target(),
        streams,
        token,
        expected=events,
        processes=CLIENT_PROCESSES,
        timeout=120,
        publishers=PUBLISHERS,
    )
    fleet.open()
    time.sleep(1.0)
    pids = service.server_pids()
    before = cpu_seconds(pids)
    first = time.time()
    with ThreadPoolExecutor(PUBLISHERS) as pool:
        list(pool.map(functools.partial(publish_paced, service, token, events, rate, first), range(PUBLISHERS)))
    fleet.collect()
    used = cpu_seconds(pids) - before
    delivered = streams * events - sum(v["missing"] for v in fleet.verdicts)
    result = {
        "deliveries": delivered,
        "server_cpu_seconds": round(used, 2),
        "us_per_delivery": round(used / delivered * 1e6, 2),
    }
    print(json.dumps(result), flush=True)
    return result


def part_cpu(redis_server, base: Path | None, repeat: int) -> dict:
    """Only `cpu_per_delivery`, on this tree and on `base` alternately, `repeat` times each."""
    out = {"load_before": load(), "runs": []}
    for _ in range(repeat):
        for name, root in [("current", None)] + ([("base", base)] if base else []):
            service = _started(redis_server, root)
            try:
                out["runs"].append({"tree": name, "load": load(), **cpu_per_delivery(service)})
            finally:
                service.__exit__(None, None, None)
    out["load_after"] = load()
    return out


def _started(redis_server, root: Path | None) -> Service:
    """The service on `root` (None: this tree), with `Service`'s login and API key."""
    service = Service(redis_server).__enter__()
    if root is not None:  # the same Redis, login and API key; the other checkout's code serves
        service.app.stop()
        service.app.root = root
        service.app.start()
    return service


def part_keep(redis_server, base: Path | None, streams: int, rates: list[int], repeat: int = 1) -> dict:
    """`make bench`'s broadcast and sustained runs on this tree and on `base`, alternately, `repeat` times
    (on a machine whose load changes, the two trees then share its quiet and busy minutes)."""
    from bench.run import capacity, sustained

    out = {"streams": streams, "rates": rates, "load_before": load(), "runs": []}
    trees = [("current", None)] + ([("base", base)] if base else [])
    for _ in range(repeat):
        for name, root in trees:
            row = {"tree": name, "load_before": load()}
            service = _started(redis_server, root)
            try:
                row["capacity"] = capacity(service, service.target(), streams, service.server_pids)
            finally:
                service.__exit__(None, None, None)
            service = _started(redis_server, root)
            try:
                row["sustained"] = sustained(service, service.target(), 1000, rates)
            finally:
                service.__exit__(None, None, None)
            service = _started(redis_server, root)
            try:
                row["cpu_per_delivery"] = cpu_per_delivery(service)
            finally:
                service.__exit__(None, None, None)
            row["load_after"] = load()
            out["runs"].append(row)
    with Nchan() as peer:
        out["nchan_capacity"] = capacity(peer, peer.target(), streams, peer.server_pids)
    out["load_after"] = load()
    last = RESULTS / "latest.json"
    if last.exists():
        previous = json.loads(last.read_text())
        row = next((r for r in previous["capacity"] if r["system"] == "service sse" and r["streams"] == streams), None)
        best = max(
            (r["deliveries_per_second"] for r in previous["sustained"] if r["system"] == "service sse"), default=None
        )
        nchan = next((r for r in previous["capacity"] if r["system"] == "nchan" and r["streams"] == streams), None)
        out["last_run"] = {
            "started": previous["started"],
            "broadcast_p99_ms": row["broadcast"]["p99_ms"] if row else None,
            "rss_per_connection_kb": row["rss_per_connection_kb"] if row else None,
            "best_deliveries_per_second": best,
            "nchan_broadcast_p99_ms": nchan["broadcast"]["p99_ms"] if nchan else None,
        }
    return out


# ---------------------------------------------------------------------------------------------------------
# Report


def _lat(r: dict) -> str:
    return f"{r['latency_p50_ms']} / {r['latency_p99_ms']} / {r['latency_max_ms']} ms"


def _due(r: dict) -> str:
    if r.get("due_to_receive_p50_ms") is None:
        return "-"
    return f"{r['due_to_receive_p50_ms']} / {r['due_to_receive_p99_ms']} ms"


SHOWN_AS = {"service": "service", "base": "service, `--base` checkout", "nchan": "nchan"}


def _open_cpu(r: dict) -> str:
    return f" ({r['open_server_cpu_seconds']} s CPU)" if "open_server_cpu_seconds" in r else ""


def _redis_cpu(r: dict) -> str:
    return f" (Redis {r['redis_cpu_seconds']} s more)" if "redis_cpu_seconds" in r else ""


def _close_cpu(r: dict) -> str:
    return f"; closing {r['close_server_cpu_seconds']} s" if "close_server_cpu_seconds" in r else ""


def _rooms_rows(p: dict) -> list[str]:
    rows = []
    for name in ("service", "base", "nchan"):
        if name not in p:
            continue
        r = p[name]
        how = "one request per event" if r["publish"].get("one_request_per_event", name == "nchan") else "batches"
        spread = r.get("publisher_connections_per_worker")
        rows.append(
            f"| {p['started']}, `{p['command']}` | {SHOWN_AS[name]} | {how} | {r['opened']:,} of {r['streams']:,} "
            f"| {r['open_seconds']} s{_open_cpu(r)} "
            f"| {r['rss_per_subscriber_kb']} / {r['rss_per_subscriber_after_traffic_kb']} KB "
            f"| {r['publish']['achieved_rate']}/s, late p99 {r['publish']['send_late_p99_ms']:.0f} ms | {_due(r)} "
            f"| {_lat(r)} | {' + '.join(map(str, spread)) if spread else '-'} "
            f"| {r['deliveries']:,} of {r['expected_deliveries']:,} "
            f"| {r['missing']} / {r['duplicates']} / {r['out_of_order']} / {r['foreign']} "
            f"| {r['server_cpu_seconds']} s{_redis_cpu(r)}{_close_cpu(r)} | {r['client_cpu_seconds']} s "
            f"| {p['load_before']} / {r.get('load_during') or '-'} / {p['load_after']} |"
        )
    return rows


def _storm_rows(s: dict) -> list[str]:
    failures = sum(s["open_failures"].values())
    return [
        f"| {s['started']}, `{s['command']}` | {s['users']:,} in {s['window_seconds']} s, "
        f"join_leave {s.get('join_leave', True)}{', as diffs' if s.get('presence_diff') else ''} "
        f"| {s['opened']:,}, {failures} failed; last {s['last_open_s']} s; p50 / p99 {s['open_p50_ms']} / "
        f"{s['open_p99_ms']} ms | {s['count_right_s']} s | {s['joins_all_s']} s "
        f"| {s['joins_missing']} / {s['joins_duplicated']} / {s.get('rejoins', '-')} "
        f"| {s['count_while_held']:,}, {s['leaves_before_close']} "
        f"| {s['leave_count_right_s']} s / {s['leaves_all_s']} s | {s['leaves_missing']} / {s['leaves_duplicated']} "
        f"| {s['redis_commands_per_join']} | {sum(s.get('presence_errors', {}).values())} "
        f"| {s['load_before']} / {s['load_after']} |"
    ]


def table(results: dict, heading: bool = True) -> str:
    """Markdown: each part's figures, each run with its time, load average and (in README) its command."""
    lines = [f"Machine: {results.get('machine', '')}.", ""] if heading else []
    if results.get("rooms"):
        lines += [
            "Many small rooms: 1,000 channels x 10 SSE subscribers (10,000 users), one event per channel per second "
            "for 30 s; latency from when the event fell due, and from its publish request's sending, to its arrival; "
            "the publisher's connections on each worker at the end of the publishing:",
            "",
            "| run | system | publishing | opened | open time (server CPU) | RSS per subscriber (idle / after traffic) "
            "| publish rate | due to receive p50 / p99 | send to receive p50 / p99 / max "
            "| publisher connections per worker | deliveries | missing / twice / out of order / other room "
            "| server CPU | client CPU | load before / during / after |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in results["rooms"]:
            lines += _rooms_rows(p)
    if results.get("storms"):
        lines += [
            "",
            "Join storm: users open an SSE stream of one presence channel evenly over the window, a watcher reads "
            "it; times from the first open's due time (leaves: from when all close):",
            "",
            "| run | users | streams opened, open time | count right | every join at the watcher "
            "| joins missing / twice / again after a leave | count held, leaves before closing "
            "| count back / every leave "
            "| leaves missing / twice | Redis commands per join | presence 503s | load before / after |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in results["storms"]:
            lines += _storm_rows(s)
    if "subscriptions" in results:
        s = results["subscriptions"]
        lines += [
            "",
            f"Subscriptions (`{s['command']}`, {s['started']}, load average before {s['load_before']}, after "
            f"{s['load_after']}): {s['connections']:,} connections, each reading 1 channel, then {s['wide']} "
            f"(of a pool of {s['pool']:,}); a fresh server each.",
            "",
            "| system | channels per connection | RSS per connection | open time | Redis commands per connection |",
            "|---|---|---|---|---|",
        ]
        for system in ("service", "nchan"):
            for label, per in (("one", 1), ("wide", s["wide"])):
                r = s[f"{system}_{label}"]
                lines.append(
                    f"| {system} | {per} | {r['rss_per_connection_kb']} KB | {r['open_seconds']} s "
                    f"| {r.get('redis_commands_per_connection', '-')} |"
                )
        w = s["ws_frames"]
        lines += [
            "",
            "Memory per subscription beyond a connection's first: "
            f"service {s['service_per_extra_subscription_kb']} KB, "
            f"nchan {s['nchan_per_extra_subscription_kb']} KB. Redis commands per extra channel in `?channels=`: "
            f"{s['service_redis_commands_per_extra_subscription']}; per WebSocket subscribe frame "
            f"({w['subscribes']:,} frames): {w['redis_commands_per_subscribe']} "
            f"({', '.join(f'{k} {v}' for k, v in w['redis_by_command_per_subscribe'].items())}).",
        ]
    if "keep" in results:
        k = results["keep"]
        lines += [
            "",
            f"Keep (`{k['command']}`, {k['started']}, load average before {k['load_before']}, "
            f"after {k['load_after']}):",
            "",
            "| tree | broadcast to 10,000 SSE p50 / p99 | RSS per stream "
            "| best sustained deliveries/s (1,000 streams) | worker CPU per delivery | load before / after |",
            "|---|---|---|---|---|---|",
        ]
        for row in k.get("runs", []):
            c = row["capacity"]
            best = max(row["sustained"], key=lambda r: r["deliveries_per_second"])
            label = row["tree"] + (f", `{row['command']}` {row['started']}" if "started" in row else "")
            lines.append(
                f"| {label} | {c['broadcast']['p50_ms']:.0f} / {c['broadcast']['p99_ms']:.0f} ms "
                f"| {c['rss_per_connection_kb']} KB | {best['deliveries_per_second']:,.0f} "
                f"(at {best['rate_per_second']}/s, lag {best['lag_after_last_publish_ms']:.0f} ms) "
                f"| {str(row['cpu_per_delivery']['us_per_delivery']) + ' us' if 'cpu_per_delivery' in row else '-'} "
                f"| {row['load_before']} / {row['load_after']} |"
            )
        for n in k.get("nchan_runs") or [k["nchan_capacity"] | {"started": k["started"]}]:
            lines.append(
                f"| nchan, {n['started']} | {n['broadcast']['p50_ms']:.0f} / {n['broadcast']['p99_ms']:.0f} ms "
                f"| {n['rss_per_connection_kb']} KB | | | |"
            )
        if results.get("cpu"):
            c = results["cpu"]
            by_tree: dict[str, list[float]] = {}
            for run in c["runs"]:
                by_tree.setdefault(run["tree"], []).append(run["us_per_delivery"])
            lines.append(
                f"| worker CPU per delivery, `{c['command']}` ({c['started']}) | | | | "
                + "; ".join(f"{tree}: {', '.join(str(v) for v in values)} us" for tree, values in by_tree.items())
                + f" | {c['load_before']} / {c['load_after']} |"
            )
        if "last_run" in k:
            r = k["last_run"]
            lines.append(
                f"| last `make bench` ({r['started']}) | - / {r['broadcast_p99_ms']:.0f} ms | "
                f"{r['rss_per_connection_kb']} KB | {r['best_deliveries_per_second']:,.0f} | | |"
            )
    return "\n".join(lines) + "\n"


KEEP_RUNS = 6  # runs of rooms and storms kept in rooms.json, each with its load


def run(parts: list[str], quick: bool = False, command: str = "", **options) -> dict:
    """Run `parts`, merge them into bench/results/rooms.json: rooms and storm runs are added to the last
    ones kept (so a repeated run stands beside the earlier one), the other parts replace theirs.

    options: seconds and batch (rooms), base (keep), storm_users, storm_window, join_leave, diff (storm)."""
    path = RESULTS / "rooms.json"
    results = json.loads(path.read_text()) if path.exists() and not quick else {}
    for listed in ("rooms", "storms"):  # a single run, as the first version wrote them
        if isinstance(results.get(listed), dict):
            results[listed] = [results[listed]]
    results["machine"] = machine()
    command = command or "python -m bench.rooms" + (" --quick" if quick else "")
    with shared_redis() as redis_server:
        for part in parts:
            stamp = {"command": command, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if part == "rooms":
                seconds = 5 if quick else options.get("seconds", 30)
                rooms, per_room = (100, 3) if quick else (1000, 10)
                done = part_rooms(
                    redis_server, rooms, per_room, seconds, options.get("batch", False), options.get("base")
                )
                results["rooms"] = (results.get("rooms") or [])[-KEEP_RUNS + 1 :] + [stamp | done]
            elif part == "storm":
                users = 200 if quick else options.get("storm_users", 5000)
                window = 2 if quick else options.get("storm_window", 10)
                done = part_storm(
                    redis_server,
                    users,
                    window,
                    5 if quick else 30,
                    options.get("join_leave", True),
                    options.get("diff"),
                )
                results["storms"] = (results.get("storms") or [])[-KEEP_RUNS + 1 :] + [stamp | done]
            elif part == "subscriptions":
                done = part_subscriptions(redis_server, 100 if quick else 2000, 10 if quick else 100)
                results["subscriptions"] = stamp | done
            elif part == "cpu":
                results["cpu"] = stamp | part_cpu(redis_server, options.get("base"), options.get("repeat", 1))
            elif part == "keep":
                rates = [100] if quick else [100, 250, 500, 1000]
                done = part_keep(
                    redis_server, options.get("base"), 1000 if quick else 10000, rates, options.get("repeat", 1)
                )
                results["keep"] = stamp | done
    RESULTS.mkdir(exist_ok=True)
    if not quick:
        path.write_text(json.dumps(results, indent=2))
        (RESULTS / "rooms.md").write_text(table(results))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small counts, results not written")
    parser.add_argument("--parts", default="rooms,storm,subscriptions", help="of rooms,storm,subscriptions,keep,cpu")
    parser.add_argument("--seconds", type=int, default=30, help="publishing period of the rooms part")
    parser.add_argument("--batch", action="store_true", help="rooms: the service publishes in batches every 50 ms")
    parser.add_argument("--storm-users", type=int, default=5000)
    parser.add_argument("--storm-window", type=float, default=10.0, help="seconds over which the users join")
    parser.add_argument("--no-join-leave", action="store_true", help="storm in a namespace with presence only")
    parser.add_argument("--diff", action="store_true", help="storm in a presence_diff namespace")
    parser.add_argument("--base", type=Path, help="a checkout to run the keep and rooms parts on beside this tree")
    parser.add_argument("--repeat", type=int, default=1, help="keep: runs of each tree, alternately")
    args = parser.parse_args()
    command = "python -m bench.rooms " + " ".join(sys.argv[1:])
    results = run(
        args.parts.split(","),
        args.quick,
        command.strip(),
        seconds=args.seconds,
        batch=args.batch,
        base=args.base,
        storm_users=args.storm_users,
        storm_window=args.storm_window,
        join_leave=not args.no_join_leave,
        diff=args.diff,
        repeat=args.repeat,
    )
    print(table(results))


if __name__ == "__main__":
    main()
