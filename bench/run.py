"""`make bench`: every benchmark, for the service (WEB_CONCURRENCY=2, directly and through nginx) and
side by side with flask-sse and nginx+nchan in the same run. Writes bench/results/latest.json,
bench/results/latest.md (the tables) and two PNG plots.

Run: .venv/bin/python -m bench.run [--quick]   (--quick: smaller connection counts, for a smoke run)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import resource
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import requests

from bench import capacity_model, publish_credentials, pubsub_traffic, rooms, single_client, webhooks_out
from bench.common import PASSWORD, machine, publisher_key, summary_ms
from bench.streams import StreamFleet, single_latency, tag
from bench.targets import FlaskSse, Nchan, Service, fd_count, rss_bytes, shared_redis

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


PUBLISHERS = 16  # publishing threads; each publishes its own events in order


def fleet_processes(count: int) -> int:
    return max(1, math.ceil(count / 8000))  # under the 20,000 descriptors one process may hold


def capacity(system, target, count: int, pids, wait_ready=None) -> dict:
    """Open `count` idle streams, read the server's footprint, then time one broadcast to all."""
    baseline = rss_bytes(pids())
    token = f"fanout-{uuid.uuid4().hex}"
    fleet = StreamFleet(target, count, token, expected=1, processes=fleet_processes(count))
    started = time.perf_counter()
    fleet.open()
    if wait_ready:
        wait_ready(count)
    open_seconds = time.perf_counter() - started
    time.sleep(1.0)
    current = pids()
    rss = rss_bytes(current)
    result = {
        "system": target.name,
        "streams": count,
        "open_seconds": round(open_seconds, 2),
        "server_rss_mb": round(rss / 2**20, 1),
        "rss_per_connection_kb": round((rss - baseline) / count / 1024, 1),
        "server_fds": fd_count(current),
        "redis_connections": system.redis_connections(),
    }
    published = time.time()
    system.publish(tag(token, 0))
    arrivals, cpu = fleet.collect()
    latencies = [a[0] - published for a in arrivals if a]
    result["broadcast"] = summary_ms(latencies) | {
        "last_client_ms": round(max(latencies) * 1000, 1),
        "missing": count - len(latencies),
        "never_opened": fleet.unopened,
        "duplicates": sum(v["duplicates"] for v in fleet.verdicts),
    }
    result["client_cpu_seconds"] = round(cpu, 2)
    print(json.dumps(result), flush=True)
    return result


BATCH_INTERVAL = 0.05  # seconds: a publisher of a system with batches sends what fell due in each


def publish_paced(system, token: str, events: int, rate: float, first: float, number: int) -> float:
    """Publisher `number`: events number, number + PUBLISHERS, ... each when due and after the previous one.
    Returns when it sent its last request.

    A system that takes batches (the service's POST /events/batch) gets this publisher's events that
    fell due in each BATCH_INTERVAL in one request: at high rates one request per event would measure
    how many publish requests the service answers while it delivers, not how many events it delivers.
    """
    mine = list(range(number, events, PUBLISHERS))
    batched = hasattr(system, "publish_batch")
    sent = first
    while mine:
        delay = first + mine[0] / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        sent = time.time()
        if not batched:
            system.publish(tag(token, mine.pop(0)))
            continue
        due_by = time.time() - first + BATCH_INTERVAL
        count = next((i for i, n in enumerate(mine) if n / rate > due_by), len(mine))
        batch, mine = mine[: min(max(count, 1), 100)], mine[min(max(count, 1), 100) :]
        system.publish_batch([tag(token, n) for n in batch])
    return sent


@dataclass
class Delivery:
    """What reached a fleet of streams from one paced publishing run."""

    fleet: StreamFleet
    arrivals: list[list[float]]
    client_cpu: float
    first_published: float
    last_sent: float  # when the last publish request went out: the rate the events were offered at
    last_published: float  # when the last publish request was answered

    def exactness(self) -> dict:
        """Events missing, delivered twice and out of order, summed over the streams."""
        verdicts = self.fleet.verdicts
        return {key: sum(v[key] for v in verdicts) for key in ("missing", "duplicates", "out_of_order")}


def paced_run(system, target, count: int, events: int, rate: float, timeout: float, label: str, wait_ready=None):
    """Open `count` streams, publish `events` numbered events at `rate` from PUBLISHERS threads, collect."""
    token = f"{label}-{uuid.uuid4().hex}"
    # At least one client process per core: one asyncio process reading 1,000 busy streams is what limits
    # the direct runs (the service then lags at 250 events/s directly, and not through nginx).
    processes = max(os.cpu_count() or 1, fleet_processes(count))
    fleet = StreamFleet(
        target, count, token, expected=events, processes=processes, timeout=timeout, publishers=PUBLISHERS
    )
    fleet.open()
    if wait_ready:
        wait_ready(count)
    time.sleep(0.5)
    first = time.time()
    with ThreadPoolExecutor(PUBLISHERS) as pool:
        sent = pool.map(functools.partial(publish_paced, system, token, events, rate, first), range(PUBLISHERS))
        last_sent = max(sent)
    last_published = time.time()
    arrivals, cpu = fleet.collect()
    return Delivery(fleet, arrivals, cpu, first, last_sent, last_published)


def sustained(system, target, count: int, rates: list[int], seconds: float = 2.0, wait_ready=None) -> list[dict]:
    """With `count` streams open, publish at each rate for `seconds`; deliveries/s and the lag behind."""
    steps = []
    for rate in rates:
        events = max(1, int(rate * seconds))
        # a saturated service publishes slower than asked: allow for ten times the planned duration
        run = paced_run(system, target, count, events, rate, seconds * 10 + 15, "rate", wait_ready)
        exact = [not any(v.values()) for v in run.fleet.verdicts]
        complete = [a for a, ok in zip(run.arrivals, exact, strict=True) if ok]
        finished = max((a[-1] for a in complete), default=float("nan"))
        step = {
            "system": target.name,
            "streams": count,
            "rate_per_second": rate,
            "achieved_publish_rate": round(events / (run.last_sent - run.first_published), 1),
            "deliveries_per_second": (
                round(len(complete) * events / (finished - run.first_published), 0) if complete else 0
            ),
            "lag_after_last_publish_ms": round((finished - run.last_published) * 1000, 1),
            "incomplete_clients": count - len(complete),
            **run.exactness(),
            "client_cpu_seconds": round(run.client_cpu, 2),
        }
        print(json.dumps(step), flush=True)
        steps.append(step)
        if step["incomplete_clients"] or step["lag_after_last_publish_ms"] > 1000:
            break  # it no longer keeps up: higher rates would only fall further behind
    return steps


def overload(system, target, count: int, rate: float, seconds: float = 4.0) -> dict:
    """Publish at `rate` (twice what the service delivered to `count` streams) for `seconds`, then stop.

    A service that degrades instead of collapsing closes no stream for its own slowness, and every
    stream catches up exactly (every event once, in order) once the rate drops.
    """
    events = max(1, int(rate * seconds))
    run = paced_run(system, target, count, events, rate, seconds * 15 + 30, "overload")
    finished = max((a[-1] for a in run.arrivals if a), default=float("nan"))
    verdicts = run.fleet.verdicts
    result = {
        "system": target.name,
        "streams": count,
        "rate_per_second": round(rate, 1),
        "achieved_publish_rate": round(events / (run.last_sent - run.first_published), 1),
        "events": events,
        "closed_by_server": sum(v["closed_by_server"] for v in verdicts),
        "exact_clients": sum(not any(v.values()) for v in verdicts),
        **run.exactness(),
        "caught_up_ms_after_last_publish": round((finished - run.last_published) * 1000, 1),
        "client_cpu_seconds": round(run.client_cpu, 2),
    }
    print(json.dumps(result), flush=True)
    return result


def single(system, target, count: int) -> dict:
    latencies = single_latency(target, system.raw_publish(), count)
    result = {"system": target.name, **summary_ms(latencies)}
    print(json.dumps(result), flush=True)
    return result


def per_transport(service: Service, count: int, through_nginx: bool) -> list[dict]:
    """One client, publish-to-receive per transport, with bench.single_client's own clients."""
    base = service.nginx.url if through_nginx else service.app.url
    measured = single_client.run(base, count, publisher_key(service.app.env))
    suffix = " via nginx" if through_nginx else ""
    rows = [{"system": f"service {name}{suffix}, Python clients", **summary} for name, summary in measured.items()]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def wrk(url: str, headers: dict, seconds: int = 8, connections: int = 64, script: str | None = None) -> dict:
    """`wrk -t2` on `url` (with a Lua `script`'s requests when given): its rate, latency and non-2xx answers."""
    command = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency"]
    for key, value in headers.items():
        command += ["-H", f"{key}: {value}"]
    command += ["-s", script] if script else []
    output = subprocess.run(command + [url], capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    p50 = re.search(r"50%\s+([\d.]+)(\w+)", output)
    p99 = re.search(r"99%\s+([\d.]+)(\w+)", output)
    unit = {"us": 0.001, "ms": 1, "s": 1000}
    return {
        "requests": int(re.search(r"(\d+) requests in", output).group(1)),
        "requests_per_second": rate,
        "p50_ms": round(float(p50.group(1)) * unit[p50.group(2)], 3),
        "p99_ms": round(float(p99.group(1)) * unit[p99.group(2)], 3),
        "non_2xx": int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", output)) else 0,
    }


def auth_cost(service: Service, through_nginx: bool = False) -> dict:
    base = service.nginx.url if through_nginx else service.app.url
    bearer = {"Authorization": f"Bearer {service.token}"}
    me, health = wrk(f"{base}/auth/me", bearer), wrk(f"{base}/healthz", {})
    ratio = round(me["requests_per_second"] / health["requests_per_second"], 3)
    result = {"via": "nginx" if through_nginx else "direct", "auth_me": me, "healthz": health, "ratio": ratio}
    print(json.dumps(result), flush=True)
    return result


def _login_storm(base: str, email: str, threads: int, stop) -> None:
    """Log in without pause from `threads` threads until `stop` is set (runs in its own process)."""

    def loop():
        with requests.Session() as http:
            while not stop.is_set():
                http.post(f"{base}/auth/login", json={"email": email, "password": PASSWORD})

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def hub_stalls(service: Service, streams: int = 200, events: int = 50, logins: int = 50) -> dict:
    """Event latency for open streams while many logins hash passwords at once, next to a quiet run.

    The login storm runs in other processes, so the publisher's timestamps here do not wait for the
    storm's threads (the GIL) but only for the server.
    """
    email = f"storm-{uuid.uuid4().hex[:8]}@example.com"
    requests.post(f"{service.app.url}/auth/register", json={"email": email, "password": PASSWORD})
    context = get_context("fork")

    def run(storm: bool) -> dict:
        token = f"stall-{uuid.uuid4().hex}"
        fleet = StreamFleet(service.target(), streams, token, expected=events, processes=1)
        fleet.open()
        time.sleep(0.5)
        stop = context.Event()
        stormers = [
            context.Process(target=_login_storm, args=(service.app.url, email, logins // 5, stop))
            for _ in range(5 if storm else 0)
        ]
        for process in stormers:
            process.start()
        time.sleep(1.0 if storm else 0)  # let the storm fill the hashing queue
        published = []
        for n in range(events):
            published.append(time.time())
            service.publish(tag(token, n))
            time.sleep(0.05)
        arrivals, _ = fleet.collect()
        stop.set()
        for process in stormers:
            process.join()
        latencies = [a[i] - published[i] for a in arrivals for i in range(min(len(a), events))]
        return summary_ms(latencies)

    run(True)  # warm-up: a fresh server's first storm (imports, pools) is not what is measured
    result = {"quiet": run(False), "during_logins": run(True), "streams": streams, "concurrent_logins": logins}
    result["p99_increase_ms"] = round(result["during_logins"]["p99_ms"] - result["quiet"]["p99_ms"], 2)
    print(json.dumps(result), flush=True)
    return result


def _hash_for(seconds: float) -> int:
    from app.auth.passwords import PASSWORD_CONTEXT

    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        PASSWORD_CONTEXT.hash(PASSWORD)
        done += 1
    return done


def rates(service: Service, seconds: float = 5.0) -> dict:
    """Logins/s and refresh rotations/s (8 concurrent clients), next to the raw Argon2 hash rate."""
    base = service.app.url
    email = f"rate-{uuid.uuid4().hex[:8]}@example.com"
    requests.post(f"{base}/auth/register", json={"email": email, "password": PASSWORD})
    body = {"email": email, "password": PASSWORD, "transport": "body"}

    def loop(action) -> int:
        done, deadline = 0, time.perf_counter() + seconds
        with requests.Session() as http:
            state = http.post(f"{base}/auth/login", json=body).json()["refresh_token"]
            while time.perf_counter() < deadline:
                state = action(http, state)
                done += 1
        return done

    def login(http, state):
        http.post(f"{base}/auth/login", json=body).raise_for_status()
        return state

    def rotate(http, refresh_token):
        response = http.post(f"{base}/auth/refresh", json={"refresh_token": refresh_token})
        response.raise_for_status()
        return response.json()["refresh_token"]

    with ThreadPoolExecutor(8) as pool:
        logins = sum(pool.map(lambda _: loop(login), range(8)))
        rotations = sum(pool.map(lambda _: loop(rotate), range(8)))
    with get_context("fork").Pool(2) as pool:  # both cores, as the server's thread pool would use them
        hashes = sum(pool.map(_hash_for, [seconds, seconds]))
    result = {
        "logins_per_second": round(logins / seconds, 1),
        "refresh_rotations_per_second": round(rotations / seconds, 1),
        "raw_argon2_hashes_per_second_2_cores": round(hashes / seconds, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def plot(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict]] = {}
    for row in results["capacity"]:
        series.setdefault(row["system"], []).append(row)
    for metric, ylabel, filename in (
        ("rss_per_connection_kb", "server memory per open connection (KB)", "memory_per_connection.png"),
        ("broadcast_p99_ms", "broadcast publish-to-receive p99 (ms)", "broadcast_latency.png"),
    ):
        figure, axis = plt.subplots(figsize=(8, 5))
        for name, rows in sorted(series.items()):
            rows = sorted(rows, key=lambda r: r["streams"])
            values = [r["broadcast"]["p99_ms"] if metric == "broadcast_p99_ms" else r[metric] for r in rows]
            axis.plot([r["streams"] for r in rows], values, marker="o", label=name)
        axis.set_xlabel("open streams")
        axis.set_ylabel(ylabel)
        axis.set_xscale("log")
        axis.grid(True, alpha=0.3)
        axis.legend()
        axis.set_title(f"{ylabel} ({results['machine']})", fontsize=9)
        figure.tight_layout()
        figure.savefig(RESULTS / filename, dpi=110)
        plt.close(figure)


def _wrk_row(name: str, run: dict) -> str:
    return f"| {name} | {run['requests_per_second']:,.0f} | {run['p50_ms']} ms | {run['p99_ms']} ms |"


def tables(results: dict) -> str:
    lines = [f"Machine: {results['machine']}. Run: {results['started']} (`{results['command']}`).", ""]
    lines += [
        "| system | streams | open time | RSS/connection | server fds | Redis conns "
        "| broadcast p50 / p99 / last | missing | client CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["capacity"]:
        b = r["broadcast"]
        lines.append(
            f"| {r['system']} | {r['streams']:,} | {r['open_seconds']} s | {r['rss_per_connection_kb']} KB | "
            f"{r['server_fds']:,} | {r['redis_connections']} | {b['p50_ms']:.0f} / {b['p99_ms']:.0f} / "
            f"{b['last_client_ms']:.0f} ms | {b['missing']} | {r['client_cpu_seconds']} s |"
        )
    lines += [
        "",
        "| system | streams | target rate/s | achieved | deliveries/s | lag after last publish | incomplete "
        "| missing / twice / out of order |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["sustained"]:
        lines.append(
            f"| {r['system']} | {r['streams']} | {r['rate_per_second']} | {r['achieved_publish_rate']} | "
            f"{r['deliveries_per_second']:,.0f} | {r['lag_after_last_publish_ms']} ms | {r['incomplete_clients']} "
            f"| {r.get('missing', '-')} / {r.get('duplicates', '-')} / {r.get('out_of_order', '-')} |"
        )
    lines += ["", "| publishing (8 client processes) | requests/s | events/s | p50 | p99 |", "|---|---|---|---|---|"]
    for r in results.get("publishing", []):
        lines.append(
            f"| {r['name']} | {r['requests_per_second']:,} | {r['events_per_second']:,} | "
            f"{r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms |"
        )
    lines += ["", "| one client, 1,000 events | p50 | p99 | max |", "|---|---|---|---|"]
    for r in results["single_client"]:
        lines.append(f"| {r['system']} | {r['p50_ms']} ms | {r['p99_ms']} ms | {r['max_ms']} ms |")
    lines += ["", "| wrk -t2 -c64 | requests/s | p50 | p99 |", "|---|---|---|---|"]
    for a in results["auth_cost"]:
        lines += [
            _wrk_row(f"GET /auth/me (bearer), {a['via']}", a["auth_me"]),
            _wrk_row(f"GET /healthz, {a['via']}", a["healthz"]),
            f"| ratio, {a['via']} | {a['ratio']:.0%} | | |",
        ]
    h = results["hub_stalls"]
    lines += [
        "",
        f"| {h['streams']} streams, 50 events | p50 | p99 | max |",
        "|---|---|---|---|",
        f"| quiet | {h['quiet']['p50_ms']} ms | {h['quiet']['p99_ms']} ms | {h['quiet']['max_ms']} ms |",
        f"| during {h['concurrent_logins']} concurrent logins | {h['during_logins']['p50_ms']} ms | "
        f"{h['during_logins']['p99_ms']} ms | {h['during_logins']['max_ms']} ms |",
    ]
    r = results["rates"]
    lines += [
        "",
        f"Logins: {r['logins_per_second']}/s; raw Argon2id hashes on both cores: "
        f"{r['raw_argon2_hashes_per_second_2_cores']}/s; refresh rotations: {r['refresh_rotations_per_second']}/s.",
    ]
    if "overload" in results:
        o = results["overload"]
        lines += [
            "",
            "| overload: twice the deliverable rate | streams | asked / achieved events/s | cut off | exact "
            "| missing / twice / out of order | caught up after the last publish |",
            "|---|---|---|---|---|---|---|",
            f"| {o['system']} | {o['streams']:,} | {o['rate_per_second']} / {o['achieved_publish_rate']} | "
            f"{o['closed_by_server']} | {o['exact_clients']:,} | {o['missing']} / {o['duplicates']} / "
            f"{o['out_of_order']} | {o['caught_up_ms_after_last_publish']:.0f} ms |",
        ]
    if "outgoing_webhooks" in results:
        lines += ["", "Outgoing webhooks (one delivery process):", "", webhooks_out.table(results["outgoing_webhooks"])]
    if "capacity_model" in results:
        lines += ["", "Capacity model (`bench/capacity_model.py`, docs/capacity.md):", ""]
        lines.append(capacity_model.table(results["capacity_model"]).rstrip("\n"))
    if "pubsub_traffic" in results:
        lines += ["", "Redis output per published event, one reader on one instance:", ""]
        lines.append(pubsub_traffic.table(results["pubsub_traffic"]).rstrip("\n"))
    if "rooms" in results:
        lines += ["", "Channels: many small rooms, a join storm, subscriptions (`bench/rooms.py`):", ""]
        lines.append(rooms.table(results["rooms"], heading=False).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _row(results: dict, system: str, streams: int) -> dict | None:
    return next((r for r in results["capacity"] if r["system"] == system and r["streams"] == streams), None)


def verdict_row(target: str, value: str, passed: bool | None) -> str:
    """One target's row: what it asks, where this run stands, PASS or MISS (- when not measured)."""
    mark = "-" if passed is None else "PASS" if passed else "MISS"
    return f"| {target} | {value} | {mark} |"


def targets(results: dict) -> str:
    """The fan-out targets, each with where this run stands and PASS or MISS."""
    lines = ["| target | this run | |", "|---|---|---|"]
    sse10k, nchan10k = _row(results, "service sse", 10000), _row(results, "nchan", 10000)
    sse20k, sse40k, ws10k = (
        _row(results, n, c) for n, c in (("service sse", 20000), ("service sse", 40000), ("service ws", 10000))
    )
    if sse10k and nchan10k:
        ours, theirs = sse10k["broadcast"]["p99_ms"], nchan10k["broadcast"]["p99_ms"]
        lines.append(
            verdict_row(
                "broadcast to 10,000 SSE streams, p99 <= 1.5x nchan's",
                f"{ours:.0f} ms, nchan {theirs:.0f} ms ({ours / theirs:.1f}x)",
                ours <= 1.5 * theirs,
            )
        )
        memory, nchan_memory = sse10k["rss_per_connection_kb"], nchan10k["rss_per_connection_kb"]
        lines.append(
            verdict_row(
                "memory per SSE stream <= 1.5x nchan's",
                f"{memory} KB, nchan {nchan_memory} KB ({memory / nchan_memory:.1f}x)",
                memory <= 1.5 * nchan_memory,
            )
        )
    if sse20k:
        p99 = sse20k["broadcast"]["p99_ms"]
        lines.append(
            verdict_row(
                "broadcast to 20,000 SSE streams, p99 < 1 s",
                f"{p99:.0f} ms, {sse20k['broadcast']['missing']} missed",
                p99 < 1000 and not sse20k["broadcast"]["missing"],
            )
        )
    if ws10k and sse10k:
        ws, sse = ws10k["rss_per_connection_kb"], sse10k["rss_per_connection_kb"]
        lines.append(
            verdict_row(
                "memory per WebSocket <= 1.25x an SSE stream",
                f"{ws} KB against {sse} KB ({ws / sse:.2f}x)",
                ws <= 1.25 * sse,
            )
        )

    def best(system: str) -> float:
        return max((r["deliveries_per_second"] for r in results["sustained"] if r["system"] == system), default=0)

    if best("nchan"):
        ours, theirs = best("service sse"), best("nchan")
        lines.append(
            verdict_row(
                "sustained deliveries/s to 1,000 streams >= half of nchan's",
                f"{ours:,.0f} against {theirs:,.0f} ({ours / theirs:.0%})",
                ours >= theirs / 2,
            )
        )
    heavy = results.get("overload")
    if heavy:
        reached = heavy["achieved_publish_rate"] >= 0.9 * heavy["rate_per_second"]
        fine = not heavy["closed_by_server"] and heavy["exact_clients"] == heavy["streams"] if reached else None
        lines.append(
            verdict_row(
                "at twice the deliverable rate: no stream cut off, every stream catches up exactly",
                f"{heavy['achieved_publish_rate']}/s to {heavy['streams']:,} streams: "
                f"{heavy['closed_by_server']} cut off, {heavy['exact_clients']:,} exact, caught up "
                f"{heavy['caught_up_ms_after_last_publish']:.0f} ms after the last publish",
                fine,
            )
        )
    single_sse = next((r for r in results["single_client"] if r["system"] == "service sse"), None)
    if single_sse:
        lines.append(
            verdict_row(
                "one client, publish to receive p50 < 1.5 ms",
                f"SSE {single_sse['p50_ms']} ms",
                single_sse["p50_ms"] < 1.5,
            )
        )
    direct = next((a for a in results.get("auth_cost", []) if a["via"] == "direct"), None)
    if direct:
        lines.append(
            verdict_row(
                "GET /auth/me >= 70 % of GET /healthz requests/s", f"{direct['ratio']:.0%}", direct["ratio"] >= 0.7
            )
        )
    if sse40k:
        missing, unopened = sse40k["broadcast"]["missing"], sse40k["broadcast"].get("never_opened", 0)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        lines.append(
            verdict_row(
                "40,000 SSE streams on two workers, all reached by one broadcast",
                f"{sse40k['streams'] - unopened:,} opened, {missing:,} missed; the descriptor limit ({limit:,} per "
                f"process, less each worker's own) leaves room for at most {2 * (limit - 100):,}",
                not missing,
            )
        )
    else:
        lines.append(
            verdict_row("40,000 SSE streams on two workers, all reached by one broadcast", "not run (--quick)", None)
        )
    return "\n".join(lines) + "\n"


def write_into_readme(results: dict) -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    start, end = "<!-- results -->", "<!-- /results -->"
    if start in text and end in text:
        block = f"{start}\n{tables(results)}\n### Against the targets\n\n{targets(results)}{end}"
        readme.write_text(text[: text.index(start)] + block + text[text.index(end) + len(end) :])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run of every benchmark")
    args = parser.parse_args()
    counts = [200, 1000] if args.quick else [1000, 5000, 10000, 20000]
    sse_counts = counts + ([] if args.quick else [40000])  # 20,000 per worker, under each one's descriptor limit
    nginx_counts = [c for c in counts if c <= 10000]  # nginx holds two descriptors per proxied stream
    peer_counts = [c for c in counts if c <= 10000]  # flask-sse: one Redis connection per stream
    single_count = 100 if args.quick else 1000
    rate_steps = [50, 200] if args.quick else [100, 250, 500, 1000, 2000]
    results = {
        "machine": machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python -m bench.run" + (" --quick" if args.quick else ""),
        "capacity": [],
        "sustained": [],
        "single_client": [],
    }
    with shared_redis() as redis_server:
        # A fresh server for every capacity run: a server learns that an idle stream's client left
        # only at its next write, so the previous run's streams would still be held.
        for transport, through_nginx, sizes in (
            ("sse", False, sse_counts),
            ("ws", False, counts),
            ("sse", True, nginx_counts),
            ("ws", True, nginx_counts),
        ):
            for count in sizes:
                with Service(redis_server) as service:
                    if count > 20000:  # more streams than the two workers' descriptor limits hold
                        service.spare_publisher()
                    target = service.target(transport, through_nginx=through_nginx)
                    pids = lambda s=service, n=through_nginx: s.server_pids(n)  # noqa: E731
                    results["capacity"].append(capacity(service, target, count, pids))
        with Service(redis_server) as service:
            results["sustained"] += sustained(service, service.target(), 1000, rate_steps)
            delivered = max(r["deliveries_per_second"] for r in results["sustained"]) / 1000
            results["overload"] = overload(service, service.target(), 1000, 2 * max(delivered, 1))
            results["sustained"] += sustained(service, service.target("sse", through_nginx=True), 1000, rate_steps)
            results["single_client"].append(single(service, service.target(), single_count))
            for through_nginx in (False, True):
                results["single_client"] += per_transport(service, single_count, through_nginx)
            results["auth_cost"] = [auth_cost(service), auth_cost(service, through_nginx=True)]
            results["hub_stalls"] = hub_stalls(service)
            results["rates"] = rates(service)
            results["publishing"] = publish_credentials.run(service.app.url, service.app.env)
        results["pubsub_traffic"] = pubsub_traffic.run(100 if args.quick else 500)
        for count in peer_counts:
            with FlaskSse(redis_server) as peer:
                results["capacity"].append(capacity(peer, peer.target(), count, peer.server_pids, peer.wait_subscribed))
        with FlaskSse(redis_server) as peer:
            results["sustained"] += sustained(peer, peer.target(), 1000, rate_steps, wait_ready=peer.wait_subscribed)
        for count in counts:
            with Nchan() as peer:
                results["capacity"].append(capacity(peer, peer.target(), count, peer.server_pids))
        with Nchan() as peer:
            results["sustained"] += sustained(peer, peer.target(), 1000, rate_steps)
            results["single_client"].append(single(peer, peer.target(), single_count))
    results["outgoing_webhooks"] = webhooks_out.run()  # its own Redis, service and delivery process
    quick_model = {"users": 40, "events": 400, "idle": 5} if args.quick else {}
    results["capacity_model"] = capacity_model.run(**quick_model)  # its own Redis, then a local cluster
    # Channels beside nchan (its own Redis); also writes bench/results/rooms.json and rooms.md.
    results["rooms"] = rooms.run(["rooms", "storm", "subscriptions"], quick=args.quick, command=results["command"])
    # A whole machine's connections, reconnect storms, fair latency and reloads beside nchan (its own Redis);
    # also writes bench/results/scale.json and scale.md. Imported here: bench.scale imports this module.
    from bench import scale

    results["scale"] = scale.run(list(scale.PARTS), quick=args.quick, command=results["command"])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(results, indent=2))
    (RESULTS / "latest.md").write_text(tables(results))
    plot(results)
    write_into_readme(results)
    print(tables(results))
    print(f"written: {RESULTS / 'latest.json'}, latest.md, memory_per_connection.png, broadcast_latency.png")


if __name__ == "__main__":
    main()
