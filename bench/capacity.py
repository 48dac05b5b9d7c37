"""Capacity and fan-out: open N idle authenticated SSE streams (or WebSockets), then broadcast one event.

Records the server's resident memory per open connection, the time to open them, its file descriptors
and Redis connections, and per-client publish-to-receive latency of one broadcast.
The client is asyncio on raw sockets, in its own process, so it stays cheap next to the server.

Run: .venv/bin/python -m bench.capacity --streams 1000 [--transport sse|ws] [--base URL]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import requests

from bench.common import PASSWORD, machine, service, summary_ms
from tests.servers import ROOT


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def process_tree(root_pid: int) -> list[int]:
    pids, frontier = [root_pid], [root_pid]
    while frontier:
        pid = frontier.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        pids += [int(c) for c in children]
        frontier += [int(c) for c in children]
    return pids


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def fd_count(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids if os.path.exists(f"/proc/{pid}/fd"))


def admin_token(base: str, env: dict) -> str:
    email = f"admin-{time.monotonic_ns()}@example.com"
    subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", "users", "create", "--email", email]
        + ["--password", PASSWORD, "--role", "admin"],
        cwd=ROOT,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
    )
    body = {"email": email, "password": PASSWORD, "transport": "body"}
    return requests.post(f"{base}/auth/login", json=body, timeout=30).json()["access_token"]


def user_token(base: str) -> str:
    email = f"reader-{time.monotonic_ns()}@example.com"
    requests.post(f"{base}/auth/register", json={"email": email, "password": PASSWORD}, timeout=30)
    body = {"email": email, "password": PASSWORD, "transport": "body"}
    return requests.post(f"{base}/auth/login", json=body, timeout=30).json()["access_token"]


async def open_sse(host: str, port: int, path: str, token: str):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    await reader.readuntil(b"stream open")
    return reader, writer


async def open_ws(host: str, port: int, path: str, token: str):
    reader, writer = await asyncio.open_connection(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    await reader.readuntil(b'"welcome"')
    return reader, writer


async def wait_for_marker(reader, marker: bytes) -> float:
    buffer = b""
    while marker not in buffer:
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer = buffer[-len(marker) :] + chunk
    return time.perf_counter()


async def run(base: str, streams: int, transport: str, token: str, admin: str, server_pids, redis_client) -> dict:
    url = urlparse(base)
    host, port = url.hostname, url.port or 80
    path, opener = ("/events/stream", open_sse) if transport == "sse" else ("/ws", open_ws)
    baseline_rss = rss_bytes(server_pids()) if server_pids else None
    started = time.perf_counter()
    connections = []
    semaphore = asyncio.Semaphore(200)  # connection attempts in flight

    async def open_one():
        async with semaphore:
            connections.append(await opener(host, port, path, token))

    await asyncio.gather(*(open_one() for _ in range(streams)))
    open_seconds = time.perf_counter() - started
    await asyncio.sleep(1.0)  # let the server settle before reading its memory
    result = {"transport": transport, "streams": streams, "open_seconds": round(open_seconds, 2)}
    if server_pids:
        pids = server_pids()
        rss = rss_bytes(pids)
        result |= {
            "server_rss_mb": round(rss / 2**20, 1),
            "rss_per_connection_kb": round((rss - baseline_rss) / streams / 1024, 1),
            "server_fds": fd_count(pids),
        }
    if redis_client is not None:
        result["redis_connections"] = len(redis_client.client_list()) - 1  # less our own

    marker = f"fanout-{time.monotonic_ns()}".encode()
    waits = [asyncio.ensure_future(wait_for_marker(reader, marker)) for reader, _ in connections]
    await asyncio.sleep(0.2)
    published_at = time.perf_counter()
    await asyncio.to_thread(
        requests.post,
        f"{base}/events",
        json={"channel": "broadcast", "event": "fanout", "data": marker.decode()},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=60,
    )
    arrivals = await asyncio.gather(*waits)
    latencies = [a - published_at for a in arrivals]
    result["broadcast"] = summary_ms(latencies) | {"last_client_ms": round(max(latencies) * 1000, 1)}
    for _, writer in connections:
        writer.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--transport", choices=["sse", "ws"], default="sse")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    raise_fd_limit()
    with service(workers=args.workers) as (server, redis_server):
        env = {k: v for k, v in server.env.items() if k in ("REDIS_URL", "SECRET_KEY", "JWT_SECRET", "DATA_DIR")}
        token, admin = user_token(server.url), admin_token(server.url, env)
        result = asyncio.run(
            run(
                server.url,
                args.streams,
                args.transport,
                token,
                admin,
                lambda: process_tree(server.process.pid),
                redis_server.client(),
            )
        )
    print(json.dumps({"machine": machine(), **result}, indent=2))


if __name__ == "__main__":
    main()
