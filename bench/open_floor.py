"""What opening 10,000 event streams costs, beside its floor on this stack and nchan.

Run: .venv/bin/python -m bench.open_floor [--streams 10000] [--repeat 1]

Four servers in turn, each opened by the rooms run's clients (two processes, 100 openings in flight each):
- lean: two processes of gevent's own StreamServer that read a request with one receive and answer a fixed head
  and one line (bench/peers/lean_stream.py): no HTTP parsing, no WSGI, no gunicorn; the floor of a server in
  Python on gevent;
- bare: a WSGI app on this project's gunicorn worker (two workers) that answers every stream with its headers
  and one line and holds it (bench/peers/bare_stream.py): what accepting, reading and answering a request and
  holding its connection cost in Python on gunicorn and gevent, before anything of the service;
- service: the service's `GET /events/stream?channels=rooms:r<n>` with a user's token, ten readers a room, as
  in `python -m bench.rooms`;
- nchan: nginx with nchan's EventSource subscriber, `/sub/r<n>`.
For each: the time until every stream is open, the servers' CPU meanwhile, and that CPU per stream.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import time

import requests

from bench.common import machine
from bench.publish_cost import bare_gunicorn
from bench.rooms import CLIENT_PROCESSES, RoomsNchan, _holder, _share, cpu_seconds, load, room_readers
from bench.streams import Target
from bench.targets import Service, process_tree, shared_redis
from tests.servers import ROOT, free_port, wait_until


def open_all(targets: list[Target], pids) -> dict:
    """Open `targets` from the rooms run's client processes; the time and the servers' CPU until all are open."""
    context = multiprocessing.get_context("fork")
    ready, results, close = context.Queue(), context.Queue(), context.Event()
    holders = [
        context.Process(target=_holder, args=(share, 0, 0, ready, close, results, i), daemon=True)
        for i, share in enumerate(_share(targets, CLIENT_PROCESSES))
    ]
    started, cpu_before = time.perf_counter(), cpu_seconds(pids())
    for holder in holders:
        holder.start()
    reports = [ready.get(timeout=600) for _ in holders]
    seconds, cpu = time.perf_counter() - started, cpu_seconds(pids()) - cpu_before
    close.set()
    for _ in holders:
        results.get(timeout=120)
    for holder in holders:
        holder.join(30)
    opened = sum(r["opened"] for r in reports)
    failures: dict = {}
    for report in reports:
        for reason, count in report["failures"].items():
            failures[reason] = failures.get(reason, 0) + count
    return {
        "opened": opened,
        "failures": failures,
        "open_seconds": round(seconds, 2),
        "server_cpu_seconds": round(cpu, 2),
        "cpu_per_stream_us": round(cpu / max(opened, 1) * 1e6),
    }


def _answers(port: int) -> bool:
    try:
        with requests.get(f"http://127.0.0.1:{port}/", stream=True, timeout=1) as answer:
            return answer.ok
    except requests.RequestException:
        return False


def rooms_of(streams: int) -> list[int]:
    return [n // 10 for n in range(streams)]


def room_subscribers(name: str, port: int, streams: int, opened_when: bytes = b"stream open") -> list[Target]:
    """`streams` openings of `/sub/r<n>` on a local server, ten a room, each open once `opened_when` arrives."""
    return [Target(name, "127.0.0.1", port, f"/sub/r{room}", opened_when=opened_when) for room in rooms_of(streams)]


def bare(streams: int) -> dict:
    with bare_gunicorn(app="bench.peers.bare_stream:app", answers=_answers) as (process, port):
        return open_all(room_subscribers("bare", port, streams), lambda: process_tree(process.pid))


def lean(streams: int) -> dict:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench.peers.lean_stream", str(port), "2"], cwd=ROOT)
    try:
        wait_until(lambda: _answers(port), timeout=30)
        return open_all(room_subscribers("lean", port, streams), lambda: process_tree(process.pid))
    finally:
        process.terminate()
        process.wait(30)


def service(redis_server, streams: int) -> dict:
    with Service(redis_server) as running:
        _, targets = room_readers(running, [[f"rooms:r{room}"] for room in rooms_of(streams)])
        result = open_all(targets, running.server_pids)
    redis_server.client().flushall()
    return result


def nchan(streams: int) -> dict:
    with RoomsNchan() as running:
        return open_all(room_subscribers("nchan", running.port, streams, opened_when=b"\n\n"), running.server_pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    out: dict = {"machine": machine(), "load_before": load(), "runs": []}
    with shared_redis() as redis_server:
        for _ in range(args.repeat):
            out["runs"].append(
                {
                    "lean": lean(args.streams),
                    "bare": bare(args.streams),
                    "service": service(redis_server, args.streams),
                    "nchan": nchan(args.streams),
                }
            )
    out["load_after"] = load()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
