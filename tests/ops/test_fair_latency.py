"""A gevent worker serves its keep-alive connections in turn: one whose next request is already waiting
does not keep the others waiting until it has none left (gevent_worker.py).

Each connection's requests are all sent before the workers may read any (they are stopped meanwhile), so
every one is already buffered when served: what the keep-alive loop met under load, when each client had
sent its next request before the worker read it, here without depending on timing. The order in which a
worker served them is that of its access lines, each naming its request by X-Request-ID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from tests.servers import LiveServer, wait_until

pytestmark = pytest.mark.not_on_cluster("tests gunicorn's worker, which serves the same with any Redis")

CONNECTIONS = 12
PIPELINED = 60  # requests sent at once on each connection
LONGEST_FAIR_RUN = PIPELINED // 4  # in turn, a run is 1 or 2; one connection served alone is PIPELINED


def request(name: str) -> bytes:
    return f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-ID: {name}\r\n\r\n".encode()


def read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """The status lines of `count` responses (/healthz answers a short JSON body)."""
    data = b""
    while data.count(b"HTTP/1.1 ") < count:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", data)


def worker_of(server: LiveServer, socks: list[socket.socket]) -> list[int]:
    """The worker pid holding each connection: the server side's socket inode, looked up in each worker's
    open descriptors."""
    inode_by_peer_port = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == server.port:
            inode_by_peer_port[int(fields[2].split(":")[1], 16)] = fields[9]
    owner = {}
    for pid in server.worker_pids():
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owner[target[len("socket:[") : -1]] = pid
    return [owner[inode_by_peer_port[sock.getsockname()[1]]] for sock in socks]


def longest_run(names: list[int]) -> int:
    longest = run = 0
    previous = None
    for name in names:
        run = run + 1 if name == previous else 1
        previous = name
        longest = max(longest, run)
    return longest


def test_connections_with_waiting_requests_are_served_in_turn(base_env, tmp_path):
    log_path = tmp_path / "gunicorn.log"

    def served() -> list[int]:
        """The connection of each pipelined request, in the order the workers wrote their access lines."""
        lines = (json.loads(line) for line in log_path.read_text().splitlines() if '"request_id": "fair-' in line)
        return [int(line["request_id"].split("-")[1]) for line in lines]

    server = LiveServer(base_env, workers=2, log_path=log_path)
    server.start()
    socks: list[socket.socket] = []
    try:
        for number in range(CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            socks.append(sock)
            sock.sendall(request(f"warm-{number}"))
            assert read_responses(sock, 1) == [b"HTTP/1.1 200 OK"]  # accepted, its handler waits for more
        owners = worker_of(server, socks)
        workers = server.worker_pids()
        for pid in workers:  # stopped, so that every connection's requests are waiting when they read
            os.kill(pid, signal.SIGSTOP)
        try:
            for number, sock in enumerate(socks):
                sock.sendall(b"".join(request(f"fair-{number}-{n}") for n in range(PIPELINED)))
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        for sock in socks:
            assert read_responses(sock, PIPELINED) == [b"HTTP/1.1 200 OK"] * PIPELINED
        wait_until(lambda: len(served()) == CONNECTIONS * PIPELINED, message="every access line written")
    finally:
        for sock in socks:
            sock.close()
        server.stop()

    order = served()
    runs = {}
    for pid in set(owners):
        mine = {number for number, owner in enumerate(owners) if owner == pid}
        if len(mine) > 1:  # a worker with one connection has no other to keep waiting
            runs[pid] = longest_run([number for number in order if number in mine])
    assert runs, f"no worker holds two of the connections: {owners}"
    assert max(runs.values()) <= LONGEST_FAIR_RUN, (
        f"a worker served one connection's waiting requests up to {max(runs.values())} in a row "
        f"while its others waited (longest run per worker: {runs})"
    )
