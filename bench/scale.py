"""A whole machine's worth of connections, reconnect storms, fair latency under load and restarts at
scale: the service beside nginx+nchan in the same run, on one redis-server.

- density: as many workers as the descriptor limit needs hold N SSE streams (79,000 on four workers of
  19,900); one broadcast to all; memory per stream.
- storm: N clients with a cursor connect within 2 s (as after a deploy or a network blip) while events
  are published; every connection accepted, each streaming within 10 s, every event once. Directly and
  through nginx.
- fair: `wrk -c64` on GET /auth/me and GET /healthz (p99 against p50); then /auth/me while one event a
  second is broadcast to 10,000 streams.
- reload: N streams open, events published throughout, gunicorn reloaded with SIGHUP (nginx for nchan);
  every client back, caught up by its cursor, nothing lost or read twice.
- cost: the workers' CPU per request on a new connection, and per stream opened with a cursor.

Run: .venv/bin/python -m bench.scale [--parts density,storm,fair,reload,cost] [--quick]
Writes bench/results/scale.json and bench/results/scale.md; `make bench` runs it too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import resource
import signal
import statistics
import threading
import time
import uuid
from pathlib import Path

import requests

from bench.common import machine, percentile, summary_ms
from bench.resume import Client, Plan, ResumingFleet, exactness, read_events
from bench.run import capacity, wrk
from bench.streams import StreamFleet, open_stream, tag
from bench.targets import Nchan, Service, shared_redis

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
KERNEL = {"somaxconn": "/proc/sys/net/core/somaxconn", "tcp_max_syn_backlog": "/proc/sys/net/ipv4/tcp_max_syn_backlog"}
BACKLOG = 65535  # gunicorn.conf.py's default and nginx's `listen ... backlog=`; the kernel caps both at somaxconn


def kernel_backlogs(at_least: int = BACKLOG) -> dict:
    """Raise the kernel's listen and SYN queue limits to `at_least` where this process may; what is in force."""
    values = {}
    for name, path in KERNEL.items():
        with contextlib.suppress(OSError, ValueError):
            if int(Path(path).read_text()) < at_least:
                Path(path).write_text(str(at_least))
        values[name] = int(Path(path).read_text())
    return values


def workers_for(streams: int) -> int:
    """Workers whose descriptor limits (each the limit less gunicorn.conf.py's margin of 100) hold `streams`."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(2, math.ceil(streams / (hard - 100)))


def first_cursor(system, target, token: str) -> str:
    """The `id:` of event 0 of a run, read on a stream of `target`: where the run's clients resume from."""

    async def read_first() -> str:
        stream = await open_stream(target)
        await asyncio.get_running_loop().run_in_executor(None, system.publish, tag(token, 0))
        client = Client()
        cursor, _ = await asyncio.wait_for(read_events(stream, token.encode(), client, lambda: 0 in client.seen), 30)
        stream.writer.close()
        return cursor

    return asyncio.run(read_first())


class Publisher(threading.Thread):
    """Publishes events `first`.. at `rate` per second from `start_at` until `stop` is set or `last`; notes when."""

    def __init__(self, system, token: str, start_at: float, rate: float, first: int = 1, last: int | None = None):
        super().__init__(daemon=True)
        self.system, self.token, self.start_at, self.rate = system, token, start_at, rate
        self.first, self.last = first, last
        self.stop = threading.Event()
        self.published: dict[int, float] = {}  # event number -> when its (last) publish request was sent
        self.failures: list[str] = []  # attempts that failed and were tried again

    def run(self) -> None:
        n = self.first
        while not self.stop.is_set() and (self.last is None or n <= self.last):
            delay = self.start_at + (n - self.first) / self.rate - time.time()
            if delay > 0 and self.stop.wait(delay):
                break
            sent = self._publish(n)
            if sent is None:
                break
            self.published[n] = sent
            n += 1

    def _publish(self, n: int) -> float | None:
        """Publish event n as a backend does across a reload: a connection the server closed meanwhile (its
        old worker stopping) is tried again. When its last attempt was sent, or None if none got through."""
        for _ in range(10):
            sent = time.time()
            try:
                self.system.publish(tag(self.token, n))
                return sent
            except requests.RequestException as error:
                self.failures.append(f"{n}: {type(error).__name__}")
                time.sleep(0.2)
        return None

    def numbers(self) -> list[int]:
        return sorted(self.published)


def density(redis_server, count: int) -> list[dict]:
    """`count` idle SSE streams on as many workers as the descriptor limit needs, then one broadcast."""
    rows = []
    workers = workers_for(count)
    with Service(redis_server, workers=workers, nginx_workers=2) as service:
        service.spare_publisher()  # full workers accept no publish request
        row = capacity(service, service.target(), count, service.server_pids)
        rows.append(row | {"workers": workers})
    # nginx spreads connections over its workers by a hash (reuseport), not by who has room: with one
    # worker more than the descriptor limits need, none runs out of its 20,000 (four held 75,093 of 79,000).
    with Nchan(workers=workers + 1, reuseport=True) as peer:
        row = capacity(peer, peer.target(), count, peer.server_pids)
        rows.append(row | {"workers": workers + 1})
    return rows


def storm(
    system, target, name: str, count: int, niceness: int = 0, spread: float = 2.0, events: int = 20, rate: float = 4.0
) -> dict:
    """`count` clients with a cursor connect within `spread` seconds while `events` events are published; the
    client processes at `niceness` (10: they take only the CPU the servers leave, as on a machine of their own)."""
    token = f"storm-{uuid.uuid4().hex}"
    cursor = first_cursor(system, target, token)
    start_at = time.time() + 3.0  # the client processes are up by then
    expected = list(range(1, events + 1))
    plan = Plan(
        target, count, cursor, token.encode(), expected, start_at, spread, start_at + 90, niceness=niceness, hold=True
    )
    fleet = ResumingFleet(plan, processes=4)
    fleet.start()
    publisher = Publisher(system, token, start_at, rate, first=1, last=events)
    publisher.start()
    clients = fleet.collect(timeout=150)
    publisher.join(60)
    first_open = [c.opened[0] - c.attempts[0] for c in clients if c.outcomes and c.outcomes[0] == "open"]
    failures: dict[str, int] = {}
    for client in clients:
        for outcome in client.outcomes:
            if outcome != "open":
                failures[outcome] = failures.get(outcome, 0) + 1
    attempted = [c.attempts[0] for c in clients if c.attempts]
    result = {
        "system": name,
        "clients": count,
        "client_niceness": niceness,
        "attempted_within_s": round(max(attempted) - min(attempted), 2),
        "accepted_first_try": sum(1 for c in clients if c.outcomes and c.outcomes[0] == "open"),
        "failed_attempts": failures,
        "streaming_after_s": summary_ms(first_open) if first_open else None,
        "last_streaming_after_storm_start_s": round(
            max((c.opened[0] for c in clients if c.opened), default=0) - start_at, 2
        ),
        "events": events,
        **exactness(clients, expected),
    }
    print(json.dumps(result), flush=True)
    return result


def storms(redis_server, count: int) -> list[dict]:
    rows = []
    # The clients share the servers' two cores: at nice 10 they take only what the servers leave.
    for niceness in (0, 10):
        with Service(redis_server, workers=2) as service:
            rows.append(storm(service, service.target(), "service sse", count, niceness))
        with Nchan(workers=2, buffer=100) as peer:
            rows.append(storm(peer, peer.target(), "nchan", count, niceness))
    with Service(redis_server, workers=2) as service:
        rows.append(storm(service, service.target(through_nginx=True), "service sse via nginx", count))
    # gunicorn's own default listen queue, for comparison: what the BACKLOG setting is for.
    with Service(redis_server, workers=2, extra_env={"BACKLOG": "2048"}) as service:
        rows.append(storm(service, service.target(), "service sse, BACKLOG=2048", count))
    return rows


def api_during_broadcasts(
    system, target, name: str, url: str, headers: dict, streams: int, niceness: int, seconds: int = 8
) -> dict:
    """wrk -c64 on `url` while one event a second is broadcast to `streams` open streams.

    The streams' clients would run elsewhere; here they share the two cores with the server and wrk. With
    `niceness` 10 they take only the CPU the others leave: the API's figure is then the server's own, and
    the broadcast's mostly that of clients waiting for a core."""
    token = f"fair-{uuid.uuid4().hex}"
    processes = max(2, math.ceil(streams / 8000))
    fleet = StreamFleet(target, streams, token, expected=seconds, processes=processes, niceness=niceness)
    fleet.open()
    time.sleep(1.0)
    publisher = Publisher(system, token, time.time() + 0.5, 1.0, first=0, last=seconds - 1)
    publisher.start()
    api = wrk(url, headers, seconds=seconds + 1)
    publisher.join(30)
    arrivals, _ = fleet.collect()
    latencies = [
        arrival - publisher.published[n]
        for per_stream in arrivals
        for n, arrival in enumerate(per_stream)
        if n in publisher.published
    ]
    result = {
        "system": name,
        "streams": streams,
        "client_niceness": niceness,
        "broadcasts": len(publisher.published),
        "api": api,
        "broadcast": summary_ms(latencies) if latencies else None,
        "missing": streams * len(publisher.published) - len(latencies),
    }
    print(json.dumps(result), flush=True)
    return result


def fair(redis_server, streams: int) -> dict:
    rows, during = [], []
    with Service(redis_server, workers=2) as service:
        bearer = {"Authorization": f"Bearer {service.token}"}
        for base, via in ((service.app.url, "direct"), (service.nginx.url, "nginx")):
            for path, headers in (("/auth/me", bearer), ("/healthz", {})):
                row = {"system": "service", "via": via, "path": path, **wrk(f"{base}{path}", headers)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    with Nchan(workers=2) as peer:
        url = f"http://127.0.0.1:{peer.port}/healthz"
        row = {"system": "nchan", "via": "direct", "path": "/healthz", **wrk(url, {})}
        print(json.dumps(row), flush=True)
        rows.append(row)
    for niceness in (0, 10):
        with Service(redis_server, workers=2) as service:
            url, bearer = f"{service.app.url}/auth/me", {"Authorization": f"Bearer {service.token}"}
            during.append(
                api_during_broadcasts(service, service.target(), "service sse", url, bearer, streams, niceness)
            )
        with Nchan(workers=2) as peer:
            url = f"http://127.0.0.1:{peer.port}/healthz"
            during.append(api_during_broadcasts(peer, peer.target(), "nchan", url, {}, streams, niceness))
    return {"wrk": rows, "during_broadcasts": during}


LATE = 1.0  # seconds after its publishing: an event read later was read late (a reload's catch-up)


def reload(system, target, name: str, count: int, send_reload, niceness: int = 0, rate: float = 1.0) -> dict:
    """`count` resuming streams, events at `rate`/s throughout, a reload once all are open; who is back when.
    The client processes run at `niceness` (as in `storm`).

    The rate is one both systems deliver on time before the reload (each row's `lag_before_s` shows it): at
    4 events/s to 20,000 streams the clients and the service together held both cores, and events came
    3-7 s late with no reload at all, so "caught up" measured the machine, not the reload. Clients that have
    read every event stay (`hold`), as in `storm`: 20,000 closing at once delayed the last events of the rest."""
    token = f"reload-{uuid.uuid4().hex}"
    start_at, spread = time.time() + 3.0, count / 1000
    plan = Plan(target, count, None, token.encode(), [], start_at, spread, math.inf, niceness=niceness, hold=True)
    fleet = ResumingFleet(plan, processes=max(4, math.ceil(count / 5000)))
    fleet.start()
    opened = fleet.wait_opened(count, timeout=count / 50)
    publisher = Publisher(system, token, time.time() + 0.5, rate, first=1)  # every client reads from event 1
    publisher.start()
    time.sleep(5.0)
    reloaded = time.time()
    send_reload()
    time.sleep(20.0)
    publisher.stop.set()
    publisher.join(30)
    expected = publisher.numbers()
    clients = fleet.collect(expected, until=time.time() + 60, timeout=150)
    back, caught_up, not_back, kept, lags, lags_before = [], [], 0, 0, [], []
    for client in clients:
        reconnected = [t for t in client.opened if t > reloaded]
        if reconnected:
            back.append(reconnected[0] - reloaded)
        elif client.opened and not [t for t in client.attempts if t > reloaded]:
            kept += 1  # its stream was carried over: it never left
        else:
            not_back += 1
            continue
        # Caught up once events arrive as they are published again: after the last one that came late (over
        # LATE after its publishing), such as those published while it was away.
        late, worst = reloaded, 0.0
        for n, arrival in zip(client.seen, client.arrivals, strict=True):
            lag = arrival - publisher.published.get(n, arrival)
            if arrival < reloaded:
                lags_before.append(lag)
                continue
            worst = max(worst, lag)
            if lag > LATE:
                late = max(late, arrival)
        caught_up.append(late - reloaded)
        lags.append(worst)
    result = {
        "system": name,
        "streams": count,
        "client_niceness": niceness,
        "events": len(expected),
        "all_open_before_reload": opened,
        "opened_before_reload": sum(1 for c in clients if c.opened and c.opened[0] < reloaded),
        "kept_stream": kept,
        "not_back": not_back,
        "back_after_s": round(max(back), 2) if back else None,
        "caught_up_after_s": {
            "p50": round(statistics.median(caught_up), 2),
            "p99": round(percentile(caught_up, 0.99), 2),
            "last": round(max(caught_up), 2),
        }
        if caught_up
        else None,
        "event_lag_s": {"p99": round(percentile(lags, 0.99), 2), "max": round(max(lags), 2)} if lags else None,
        "rate_per_s": rate,
        "lag_before_s": {"p99": round(percentile(lags_before, 0.99), 2), "max": round(max(lags_before), 2)}
        if lags_before
        else None,
        "connections_per_client": round(sum(len(c.opened) for c in clients) / max(1, len(clients)), 2),
        "publish_attempts_failed": len(publisher.failures),
        **exactness(clients, expected),
    }
    print(json.dumps(result), flush=True)
    return result


def reloads(redis_server, count: int) -> list[dict]:
    rows = []
    for niceness in (0, 10):
        with Service(redis_server, workers=2) as service:
            # Events are published throughout: through another instance, as backends reach the instances a
            # reload leaves alone. Through the reloaded one, a publish queued behind the 20,000 reconnections.
            service.spare_publisher()
            hup = functools.partial(service.app.signal, signal.SIGHUP)
            rows.append(reload(service, service.target(), "service sse", count, hup, niceness))
        with Nchan(workers=2, buffer=1000) as peer:
            hup = functools.partial(peer.nginx.process.send_signal, signal.SIGHUP)
            rows.append(reload(peer, peer.target(), "nchan", count, hup, niceness))
    return rows


def worker_cpu(pids: list[int]) -> float:
    """CPU seconds (user and system) the processes have used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


async def _requests_on_new_connections(port: int, path: str, headers: dict, count: int) -> None:
    gate = asyncio.Semaphore(50)

    async def one():
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            extra = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{extra}\r\n".encode())
            await reader.read()
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))


def open_cost(redis_server, count: int) -> list[dict]:
    """The workers' CPU per request on a new connection, and per stream opened (resuming from a cursor)."""
    rows = []
    with Service(redis_server, workers=2) as service:
        pids = service.app.worker_pids()
        bearer = {"Authorization": f"Bearer {service.token}"}
        for path, headers in (("/healthz", {}), ("/auth/me", bearer)):
            before = worker_cpu(pids)
            asyncio.run(_requests_on_new_connections(service.app.port, path, headers, count))
            time.sleep(0.5)
            rows.append(
                {"what": f"GET {path}, a new connection each", "ms": (worker_cpu(pids) - before) / count * 1000}
            )
        token = f"cost-{uuid.uuid4().hex}"
        target = service.target()
        cursor = first_cursor(service, target, token)
        before = worker_cpu(pids)
        plan = Plan(target, count, cursor, token.encode(), [1], time.time() + 2.0, 2.0, stop_at=time.time() + 120)
        fleet = ResumingFleet(plan, processes=2)
        fleet.start()
        fleet.wait_opened(count, timeout=100)
        time.sleep(0.5)
        rows.append(
            {"what": "GET /events/stream with Last-Event-ID, opened", "ms": (worker_cpu(pids) - before) / count * 1000}
        )
        service.publish(tag(token, 1))
        fleet.collect(timeout=60)
        # The same after a blip: each stream has 50 events to catch up, the same ones for all of them.
        token = f"cost-{uuid.uuid4().hex}"
        cursor = first_cursor(service, target, token)
        for n in range(1, 51):
            service.publish(tag(token, n))
        before = worker_cpu(pids)
        expected = list(range(1, 51))
        plan = Plan(target, count, cursor, token.encode(), expected, time.time() + 2.0, 2.0, time.time() + 120)
        fleet = ResumingFleet(plan, processes=2)
        fleet.start()
        fleet.collect(timeout=100)
        rows.append(
            {
                "what": "GET /events/stream with Last-Event-ID and 50 events to catch up: opened, read, closed",
                "ms": (worker_cpu(pids) - before) / count * 1000,
            }
        )
    for row in rows:
        row["ms"] = round(row["ms"], 3)
        print(json.dumps(row), flush=True)
    return rows


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows] + [""]


def exact(r: dict) -> str:
    return f"{r['missing']} / {r['duplicates']} / {r['out_of_order']} / {r['unexpected']}"


def seconds(summary: dict | None) -> str:
    summary = summary or {}
    return " / ".join(f"{summary.get(key, 0) / 1000:.2f}" for key in ("p50_ms", "p99_ms", "max_ms")) + " s"


def tables(results: dict) -> str:
    lines = [f"Machine: {results['machine']}. Kernel backlogs in force: {results['kernel']}.", ""]
    for part, run in results.get("runs", {}).items():
        lines.append(f"- {part}: run {run['started']} (`{run['command']}`)")
    lines.append("")
    if results.get("density"):
        header = ["density", "workers", "streams", "open time", "RSS/stream", "server fds"]
        header += ["broadcast p50 / p99 / last", "missing"]
        rows = []
        for r in results["density"]:
            b = r["broadcast"]
            latency = f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f} / {b['last_client_ms']:.0f} ms"
            rows.append(
                [r["system"], r["workers"], f"{r['streams']:,}", f"{r['open_seconds']} s"]
                + [f"{r['rss_per_connection_kb']} KB", f"{r['server_fds']:,}", latency, b["missing"]]
            )
        lines += table(header, rows)
    if results.get("cost"):
        lines += table(["workers' CPU per", "ms"], [[r["what"], r["ms"]] for r in results["cost"]])
    if results.get("storm"):
        header = ["reconnect storm", "clients", "clients' nice", "within", "accepted first try", "failed attempts"]
        header += ["streaming after p50 / p99 / max", "last streaming (from storm start)"]
        header += ["missing / twice / out of order / unexpected"]
        rows = [
            [r["system"], f"{r['clients']:,}", r.get("client_niceness", 0), f"{r['attempted_within_s']} s"]
            + [f"{r['accepted_first_try']:,}"]
            + [r["failed_attempts"] or 0, seconds(r["streaming_after_s"])]
            + [f"{r['last_streaming_after_storm_start_s']} s", exact(r)]
            for r in results["storm"]
        ]
        lines += table(header, rows)
    if results.get("fair"):
        rows = [
            [f"{r['system']} GET {r['path']}", r["via"], f"{r['requests_per_second']:,.0f}", f"{r['p50_ms']} ms"]
            + [f"{r['p99_ms']} ms", f"{r['p99_ms'] / max(r['p50_ms'], 0.001):.1f}"]
            for r in results["fair"]["wrk"]
        ]
        lines += table(["wrk -t2 -c64 -d8s", "via", "requests/s", "p50", "p99", "p99 / p50"], rows)
        header = ["API during broadcasts (1/s)", "streams", "clients' nice", "API requests/s", "API p50 / p99"]
        header += ["broadcast p50 / p99", "missing"]
        rows = []
        for r in results["fair"]["during_broadcasts"]:
            b, api = r["broadcast"] or {}, r["api"]
            rows.append(
                [r["system"], f"{r['streams']:,}", r["client_niceness"], f"{api['requests_per_second']:,.0f}"]
                + [f"{api['p50_ms']} / {api['p99_ms']} ms", f"{b.get('p50_ms')} / {b.get('p99_ms')} ms", r["missing"]]
            )
        lines += table(header, rows)
    if results.get("reload"):
        header = ["reload", "streams", "clients' nice", "opened before", "kept their stream", "not back"]
        header += ["events/s", "lag before the reload p99 / max"]
        header += ["all back after", "caught up p50 / p99 / last", "worst event lag p99 / max"]
        header += ["connections per client", "missing / twice / out of order / unexpected"]
        rows = []
        for r in results["reload"]:
            c, lag = r["caught_up_after_s"] or {}, r.get("event_lag_s") or {}
            back = f"{r['back_after_s']} s" if r["back_after_s"] is not None else "none left"
            rows.append(
                [r["system"], f"{r['streams']:,}", r.get("client_niceness", 0), f"{r['opened_before_reload']:,}"]
                + [f"{r.get('kept_stream', 0):,}", r["not_back"]]
                + [r.get("rate_per_s", 4.0), seconds_pair(r.get("lag_before_s"))]
                + [back, f"{c.get('p50')} / {c.get('p99')} / {c.get('last')} s"]
                + [seconds_pair(lag), r["connections_per_client"], exact(r)]
            )
        lines += table(header, rows)
    return "\n".join(lines)


def seconds_pair(lag: dict | None) -> str:
    return f"{lag.get('p99')} / {lag.get('max')} s" if lag else ""


PARTS = ("density", "storm", "fair", "reload", "cost")


def run(parts: list[str], quick: bool = False, command: str = "python -m bench.scale") -> dict:
    """Run `parts`; the other parts' latest results stay in scale.json and scale.md, each with its own run."""
    path = RESULTS / "scale.json"
    results = json.loads(path.read_text()) if path.exists() and not quick else {}
    results |= {"machine": machine(), "kernel": kernel_backlogs()}
    sizes = {"density": (2000, 79000), "storm": (500, 10000), "fair": (500, 10000), "reload": (1000, 20000)}
    sizes["cost"] = (300, 3000)
    runs = {"density": density, "storm": storms, "fair": fair, "reload": reloads, "cost": open_cost}
    with shared_redis() as redis_server:
        for part in PARTS:
            if part in parts:
                started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                results[part] = runs[part](redis_server, sizes[part][0 if quick else 1])
                results.setdefault("runs", {})[part] = {"started": started, "command": command}
    if not quick:
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(results, indent=2))
        (RESULTS / "scale.md").write_text(tables(results))
    print(tables(results))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    command = "python -m bench.scale" + (f" --parts {args.parts}" if args.parts != ",".join(PARTS) else "")
    run(parts, quick=args.quick, command=command + (" --quick" if args.quick else ""))


if __name__ == "__main__":
    main()
