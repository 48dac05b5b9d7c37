"""Real HTTP receivers for outgoing webhooks, in the test process, and the delivery process's runner.

A receiver listens on loopback and records every request it gets (arrival time, path, headers, body).
What it answers is chosen per path, so one receiver plays many endpoints: a healthy one, one that fails
its first N requests, one that redirects, one that never answers.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from standardwebhooks import Webhook

from app.outgoing.delivery import HEARTBEAT_TTL
from app.redis import Keys, connect
from tests.servers import ROOT, VENV_BIN, LiveServer, process_env, wait_until


@dataclass
class Received:
    """One request a receiver got."""

    at: float  # time.time() on arrival
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict:
        return json.loads(self.body)

    def verify(self, secret: str) -> dict:
        """The body, verified with the Standard Webhooks library against one secret (raises otherwise)."""
        return Webhook(secret).verify(self.body, self.headers)


@dataclass
class Behaviour:
    """How a path answers: `fail_first` requests get `fail_status`, then `status`; `hang` never answers."""

    status: int = 204
    fail_first: int = 0
    fail_on: frozenset[int] = frozenset()  # which requests (1-based) fail, besides the first `fail_first`
    fail_status: int = 500
    hang: bool = False
    delay: float = 0.0
    location: str | None = None
    body: bytes = b""
    seen: int = 0


@dataclass
class Receiver:
    """A threaded HTTP server on 127.0.0.1 recording what arrives."""

    received: list[Received] = field(default_factory=list)
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    condition: threading.Condition = field(default_factory=threading.Condition)
    release: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802 - the name http.server calls
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                path = self.path
                with receiver.condition:
                    receiver.received.append(Received(time.time(), path, dict(self.headers.items()), body))
                    behaviour = receiver.behaviours.setdefault(path, Behaviour())
                    behaviour.seen += 1
                    seen = behaviour.seen
                    receiver.condition.notify_all()
                if behaviour.hang:
                    receiver.release.wait(120)  # holds the request until the test ends
                    self.close_connection = True
                    return
                if behaviour.delay:
                    time.sleep(behaviour.delay)
                failing = seen <= behaviour.fail_first or seen in behaviour.fail_on
                status = behaviour.fail_status if failing else behaviour.status
                self.send_response(status)
                if behaviour.location:
                    self.send_header("Location", behaviour.location)
                self.send_header("Content-Length", str(len(behaviour.body)))
                self.end_headers()
                self.wfile.write(behaviour.body)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a delivery process killed on purpose resets its kept-alive connections

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def behave(self, path: str, host: str = "127.0.0.1", **how) -> str:
        """Set how `path` answers; its URL."""
        self.behaviours[path] = Behaviour(**how)
        return self.url(path, host)

    def at(self, path: str) -> list[Received]:
        with self.condition:
            return [r for r in self.received if r.path == path]

    def wait_for(self, path: str, count: int, timeout: float = 15.0) -> list[Received]:
        """The first `count` requests to `path`, waiting for them (TimeoutError if they do not come)."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while True:
                found = [r for r in self.received if r.path == path]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{len(found)} of {count} requests to {path} arrived")
                self.condition.wait(remaining)

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class DeliveryProcess:
    """`python worker.py`: the delivery process, with the environment the web servers have."""

    def __init__(self, env: dict, log_path: Path):
        self.env = process_env(env)
        self.log_path = log_path
        LiveServer.logs.append(log_path)  # the suite's end checks it for tracebacks like gunicorn's
        self.process: subprocess.Popen | None = None

    def start(self) -> DeliveryProcess:
        """Start worker.py and wait until its heartbeat is in Redis (its loops are running)."""
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [str(VENV_BIN / "python"), "worker.py"], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        client = self._redis()

        def running():
            assert self.process.poll() is None, f"worker.py exited; see {self.log_path}"
            return any(self._heartbeats(client))

        wait_until(running, timeout=20, message="the delivery process")
        client.close()
        return self

    def _redis(self):
        return connect(self.env["REDIS_URL"], 4, self.env.get("REDIS_MODE", "standalone"))

    def _heartbeats(self, client):
        """This process's heartbeat keys (its consumer names hold its pid)."""
        return client.scan_iter(match=Keys.outgoing_consumer(f"*-{self.process.pid}-*"))

    def kill(self) -> None:
        """SIGKILL: no chance to finish or acknowledge anything."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def heartbeat_lapses_now(self) -> None:
        """After `kill`: its heartbeat, which would expire by itself within HEARTBEAT_TTL (5 s), is gone now, so
        other processes take its entries over at their next look instead of five seconds later. The expiry
        itself is checked first: a heartbeat without one would keep a dead process's entries for ever."""
        assert self.process.poll() is not None, "a live process renews its heartbeat"
        client = self._redis()
        try:
            for key in self._heartbeats(client):  # none when it expired already
                left = client.pttl(key)  # -2: expired meanwhile; -1: no expiry at all
                assert left == -2 or 0 < left <= HEARTBEAT_TTL * 1000, (key, left)
                client.delete(key)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
