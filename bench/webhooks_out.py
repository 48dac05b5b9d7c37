"""Outgoing webhooks: messages per second, and publish-to-receipt delay beside an endpoint that never answers.

Run: .venv/bin/python -m bench.webhooks_out   (starts its own redis-server, gunicorn with 2 workers, one
delivery process and the receivers, all on loopback)

The receiver is an asyncio HTTP/1.1 server in its own process (keep-alive, 204 at once); one listening
socket plays every endpoint by path, and a second one accepts requests and never answers. A receipt's
delay is its arrival time less the event's `ts` (set by the service when the event was published).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import socket
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import requests

from app import create_app
from app.auth.users import create_user
from bench.common import PASSWORD, machine, service, summary_ms
from tests.outgoing.receivers import DeliveryProcess

RATE = 20  # events/s to 10 healthy endpoints: 200 messages/s, within what one delivery process sends
SETTINGS = {"WEBHOOK_OUT_ALLOW_PRIVATE": "true", "WEBHOOK_OUT_ALLOW_HTTP": "true"}


def _receive(port_pipe, results_pipe, hang: bool) -> None:
    """The receiver process: record (path, arrival, event ts) per request; report when asked."""
    arrivals: list[tuple[str, float, str]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length"))
                body = await reader.readexactly(length)
                if hang:
                    await asyncio.sleep(3600)
                arrivals.append((path, time.time(), json.loads(body)["ts"]))
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_pipe.send(server.sockets[0].getsockname()[1])
        loop = asyncio.get_running_loop()
        while True:
            if await loop.run_in_executor(None, results_pipe.poll, 0.5):
                results_pipe.recv()
                results_pipe.send(list(arrivals))
                arrivals.clear()

    asyncio.run(main())


class ReceiverProcess:
    """A receiver in its own process, so its work does not share the benchmark's interpreter."""

    def __init__(self, hang: bool = False):
        context = multiprocessing.get_context("spawn")
        self.port_pipe, port_child = context.Pipe()
        self.results, results_child = context.Pipe()
        self.process = context.Process(target=_receive, args=(port_child, results_child, hang), daemon=True)
        self.process.start()
        self.port = self.port_pipe.recv()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def take(self) -> list[tuple[str, float, str]]:
        """Every arrival since the last call."""
        self.results.send("report")
        return self.results.recv()

    def stop(self) -> None:
        self.process.kill()
        self.process.join(5)


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class Bench:
    def __init__(self, url: str, env: dict):
        self.url = url
        app = create_app(env)
        email = f"bench-{uuid.uuid4().hex[:8]}@example.com"
        with app.app_context():
            create_user(email, PASSWORD, role="admin")
        login = requests.post(
            f"{url}/auth/login", json={"email": email, "password": PASSWORD, "transport": "body"}, timeout=30
        )
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {login.json()['access_token']}"

    def endpoint(self, url: str, channel: str) -> str:
        response = self.http.post(f"{self.url}/admin/webhook-endpoints", json={"url": url, "channels": [channel]})
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def delete(self, endpoint_id: str) -> None:
        self.http.delete(f"{self.url}/admin/webhook-endpoints/{endpoint_id}")

    def publish_batches(self, channel: str, events: int) -> None:
        for start in range(0, events, 100):
            batch = [{"channel": channel, "event": "bench", "data": {"n": n}} for n in range(start, start + 100)]
            response = self.http.post(f"{self.url}/events/batch", json={"events": batch[: events - start]})
            assert response.status_code == 201, response.text

    def publish_at(self, channel: str, rate: float, seconds: float) -> int:
        count, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            self.http.post(f"{self.url}/events", json={"channel": channel, "event": "bench", "data": {"n": count}})
            count += 1
            time.sleep(max(0.0, started + count / rate - time.monotonic()))
        return count


def wait_for(receiver: ReceiverProcess, expected: int, timeout: float = 120) -> list[tuple[str, float, str]]:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        got += receiver.take()
    return got


def throughput(bench: Bench, receiver: ReceiverProcess, endpoints: int, events: int) -> dict:
    """`events` published in batches to one channel that `endpoints` endpoints follow: messages per second."""
    channel = f"bench-{uuid.uuid4().hex[:8]}"
    ids = [bench.endpoint(receiver.url(f"/t/{n}"), channel) for n in range(endpoints)]
    receiver.take()
    started = time.time()
    bench.publish_batches(channel, events)
    got = wait_for(receiver, events * endpoints)
    last = max(at for _, at, _ in got)
    for endpoint_id in ids:
        bench.delete(endpoint_id)
    result = {
        "endpoints": endpoints,
        "events": events,
        "messages": len(got),
        "missing": events * endpoints - len(got),
        "seconds": round(last - started, 2),
        "messages_per_second": round(len(got) / (last - started)),
        "delay": summary_ms([at - _epoch(ts) for _, at, ts in got]),
    }
    print(json.dumps(result), flush=True)
    return result


def delay_beside(bench: Bench, receiver: ReceiverProcess, stuck: ReceiverProcess | None, rate: float) -> dict:
    """10 healthy endpoints, events at `rate`/s for 10 s, with or without one endpoint that never answers."""
    channel = f"bench-{uuid.uuid4().hex[:8]}"
    ids = [bench.endpoint(receiver.url(f"/d/{n}"), channel) for n in range(10)]
    if stuck is not None:
        ids.append(bench.endpoint(stuck.url("/never"), channel))
    receiver.take()
    published = bench.publish_at(channel, rate, 10.0)
    got = wait_for(receiver, published * 10)
    for endpoint_id in ids:
        bench.delete(endpoint_id)
    result = {
        "never_answering_endpoint": stuck is not None,
        "events": published,
        "messages": len(got),
        "missing": published * 10 - len(got),
        "delay": summary_ms([at - _epoch(ts) for _, at, ts in got]),
    }
    print(json.dumps(result), flush=True)
    return result


def run() -> dict:
    """Every outgoing-webhook figure, on a fresh Redis, gunicorn (2 workers) and one delivery process."""
    with service(workers=2, **SETTINGS) as (server, _), tempfile.TemporaryDirectory() as logs:
        worker = DeliveryProcess(server.env, Path(logs) / "worker.log").start()
        receiver, stuck = ReceiverProcess(), ReceiverProcess(hang=True)
        try:
            bench = Bench(server.url, {**server.env})
            results = {
                "throughput": [throughput(bench, receiver, 1, 5000), throughput(bench, receiver, 50, 200)],
                "delay": [delay_beside(bench, receiver, None, RATE), delay_beside(bench, receiver, stuck, RATE)],
            }
        finally:
            receiver.stop()
            stuck.stop()
            worker.stop()
    return results


def table(results: dict) -> str:
    """The figures as Markdown."""
    rows = ["| endpoints | events | messages | messages/s | delay p50 ms | delay p99 ms |", "|---|---|---|---|---|---|"]
    for r in results["throughput"]:
        d = r["delay"]
        rows.append(
            f"| {r['endpoints']} | {r['events']} | {r['messages']} | {r['messages_per_second']} "
            f"| {d['p50_ms']:.0f} | {d['p99_ms']:.0f} |"
        )
    head = f"| 10 healthy endpoints, {RATE} events/s for 10 s | messages | delay p50 ms | delay p99 ms | max ms |"
    rows += ["", head, "|---|---|---|---|---|"]
    for r in results["delay"]:
        d = r["delay"]
        what = "beside one never-answering endpoint" if r["never_answering_endpoint"] else "alone"
        rows.append(f"| {what} | {r['messages']} | {d['p50_ms']:.1f} | {d['p99_ms']:.1f} | {d['max_ms']:.1f} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    figures = run()
    print(f"Machine: {machine()}\n")
    print(table(figures))
