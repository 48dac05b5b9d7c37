"""What the benchmarks run against: the service (directly or through nginx) and the two peers, each
started on loopback ports with one shared redis-server, and stopped after."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from bench.common import PASSWORD, publisher_key
from bench.streams import RawPublish, Target, raise_fd_limit
from scripts.nginx_config import MAIN, render_site
from tests.servers import ROOT, LiveServer, NginxServer, RedisServer, free_port, wait_until

HERE = Path(__file__).resolve().parent
NCHAN_MODULE = "/usr/lib/nginx/modules/ngx_nchan_module.so"
SECRET_ENV = {"SECRET_KEY": "b" * 40, "JWT_SECRET": "c" * 40}


def process_tree(root_pid: int) -> list[int]:
    pids, frontier = [root_pid], [root_pid]
    while frontier:
        pid = frontier.pop()
        with contextlib.suppress(OSError):
            children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            pids += children
            frontier += children
    return pids


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def fd_count(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/fd"))
    return total


@contextlib.contextmanager
def shared_redis():
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        server.client().config_set("maxclients", 19000)  # flask-sse holds one connection per stream
        try:
            yield server
        finally:
            server.stop()


def publishing_session() -> requests.Session:
    """A session with a pooled connection for each of the benchmarks' 16 publishing threads."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=16))
    return session


class Service:
    """The service with WEB_CONCURRENCY workers, and nginx in front of it."""

    def __init__(
        self, redis_server: RedisServer, workers: int = 2, extra_env: dict | None = None, nginx_workers: int = 2
    ):
        self.redis = redis_server
        self.directory = Path(tempfile.mkdtemp(prefix="bench-service-"))
        env = {
            "APP_ENV": "test",
            "DATA_DIR": str(self.directory),
            "REDIS_URL": redis_server.url,
            "RATE_LIMITS_ENABLED": "false",
            "WS_FRAME_RATE": "1000000",  # load generators subscribe by frames back to back
            "LOG_LEVEL": "warning",
            # Load generators open thousands of streams as a handful of users.
            "MAX_CONNECTIONS_PER_USER": "1000000",
            **SECRET_ENV,
            **(extra_env or {}),
        }
        self.app = LiveServer(env, workers=workers, log_path=self.directory / "app.log")
        self.spare: LiveServer | None = None
        self.nginx = NginxServer(self.directory / "nginx", [f"127.0.0.1:{self.app.port}"])
        main = MAIN.format(dir=(self.directory / "nginx").resolve(), workers=nginx_workers, connections=20000)
        self.nginx.config.write_text("worker_rlimit_nofile 20000;\n" + main)

    def __enter__(self) -> Service:
        raise_fd_limit()  # inherited by gunicorn
        self.app.start()
        self.nginx.start()
        self.token = self._login()
        self.publisher = {"Authorization": f"Bearer {publisher_key(self.app.env)}"}
        self.http = publishing_session()
        self.publish_url = self.app.url
        return self

    def __exit__(self, *exc) -> None:
        self.nginx.stop()
        if self.spare is not None:
            self.spare.stop()
        self.app.stop()

    def _login(self) -> str:
        email = f"reader-{time.monotonic_ns()}@example.com"
        requests.post(f"{self.app.url}/auth/register", json={"email": email, "password": PASSWORD}, timeout=30)
        body = {"email": email, "password": PASSWORD, "transport": "body"}
        return requests.post(f"{self.app.url}/auth/login", json=body, timeout=30).json()["access_token"]

    def target(self, transport: str = "sse", through_nginx: bool = False) -> Target:
        port = self.nginx.port if through_nginx else self.app.port
        name = f"service {transport}" + (" via nginx" if through_nginx else "")
        auth = {"Authorization": f"Bearer {self.token}"}
        if transport == "ws":
            return Target(name, "127.0.0.1", port, "/ws", auth, "ws", opened_when=b'"welcome"')
        return Target(name, "127.0.0.1", port, "/events/stream", auth, opened_when=b"stream open")

    def spare_publisher(self) -> None:
        """Publish through a second instance (one worker, the same Redis) from now on: when this one's
        workers hold all the connections their descriptor limits allow, they accept no publish request."""
        self.spare = LiveServer(self.app.env, workers=1, log_path=self.directory / "spare.log")
        self.spare.start()
        self.publish_url = self.spare.url

    def publish(self, text: str) -> None:
        self._post("/events", {"channel": "broadcast", "event": "bench", "data": text})

    def raw_publish(self) -> RawPublish:
        """POST /events as `publish` sends it, for the single-client latency."""
        port = int(self.publish_url.rsplit(":", 1)[1])
        headers = {**self.publisher, "Content-Type": "application/json"}
        event = lambda text: json.dumps({"channel": "broadcast", "event": "bench", "data": text}).encode()  # noqa: E731
        return RawPublish("127.0.0.1", port, "/events", headers, event)

    def publish_batch(self, texts: list[str]) -> None:
        """Up to 100 events in one request (POST /events/batch), in this order."""
        self._post("/events/batch", {"events": [{"channel": "broadcast", "event": "bench", "data": t} for t in texts]})

    def _post(self, path: str, body: dict) -> None:
        """As a backend publishes: a 503 (a dependency briefly unavailable) is retried after its Retry-After."""
        for attempt in range(4):
            response = self.http.post(f"{self.publish_url}{path}", json=body, headers=self.publisher, timeout=60)
            if response.status_code != 503 or attempt == 3:
                response.raise_for_status()
                return
            print(f"publish answered 503; retried (attempt {attempt + 2})", file=sys.stderr, flush=True)
            time.sleep(min(float(response.headers.get("Retry-After", "1")), 1.0))

    def server_pids(self, through_nginx: bool = False) -> list[int]:
        pids = process_tree(self.app.process.pid)
        return pids + (process_tree(self.nginx.process.pid) if through_nginx else [])

    def redis_connections(self) -> int:
        return len(self.redis.client().client_list()) - 1


class FlaskSse:
    """flask-sse under its documented `gunicorn --worker-class gevent` set-up, on the same Redis."""

    name = "flask-sse"

    def __init__(self, redis_server: RedisServer, workers: int = 2, extra_env: dict | None = None):
        self.redis = redis_server
        self.port = free_port()
        self.workers = workers

    def __enter__(self) -> FlaskSse:
        raise_fd_limit()
        env = {**os.environ, "REDIS_URL": self.redis.url}
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "-c", "bench/peers/gunicorn_plain.conf.py"]
            + ["bench.peers.flask_sse_app:app"]
            + ["--worker-class", "gevent", "--workers", str(self.workers), "--worker-connections", "20000"]
            + ["--bind", f"127.0.0.1:{self.port}", "--no-control-socket", "--log-level", "warning"],
            cwd=ROOT,
            env=env,
        )
        wait_until(lambda: requests.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).ok, timeout=20)
        self.http = publishing_session()
        return self

    def __exit__(self, *exc) -> None:
        self.process.send_signal(3)  # SIGQUIT: quick shutdown, the streams never end by themselves
        self.process.wait(20)

    def target(self) -> Target:
        # flask-sse sends its headers only with the first event: readiness is checked in Redis instead.
        return Target(self.name, "127.0.0.1", self.port, "/stream", headers_first=False)

    def wait_subscribed(self, count: int) -> None:
        client = self.redis.client()
        wait_until(lambda: client.pubsub_numsub("sse")[0][1] >= count, timeout=300, interval=0.2)

    def publish(self, text: str) -> None:
        self.http.post(f"http://127.0.0.1:{self.port}/publish", data=text, timeout=60).raise_for_status()

    def server_pids(self) -> list[int]:
        return process_tree(self.process.pid)

    def redis_connections(self) -> int:
        return len(self.redis.client().client_list()) - 1


class Nchan:
    """nginx with Debian's nchan module: a publisher location and an EventSource subscriber location."""

    name = "nchan"

    def __init__(self, workers: int = 2, buffer: int = 10, reuseport: bool = False):
        """`buffer`: messages kept for subscribers that resume with Last-Event-ID. `reuseport`: each of the
        `workers` takes its own share of new connections, so that none runs out of its 20,000."""
        self.directory = Path(tempfile.mkdtemp(prefix="bench-nchan-"))
        self.port = free_port()
        self.workers, self.buffer, self.reuseport = workers, buffer, reuseport

    SITE = (
        "server {\n    listen ${NGINX_PORT} backlog=65535;\n"
        "    location = /sub { nchan_subscriber eventsource; nchan_channel_id broadcast; }\n"
        "    location = /pub { nchan_publisher; nchan_channel_id broadcast; nchan_message_buffer_length BUFFER; }\n"
        "    location = /healthz { return 200 'ok'; }\n}\n"
    )

    def __enter__(self) -> Nchan:
        raise_fd_limit()
        site = render_site(self.port, ["127.0.0.1:1"], self.SITE.replace("BUFFER", str(self.buffer)))
        if self.reuseport:
            site = site.replace(" backlog=", " reuseport backlog=", 1)
        nginx = NginxServer(self.directory, ["127.0.0.1:1"], site=site)
        nginx.port = self.port
        main = MAIN.format(dir=self.directory.resolve(), workers=self.workers, connections=20000)
        nginx.config.write_text(f"load_module {NCHAN_MODULE};\nworker_rlimit_nofile 20000;\n" + main)
        nginx.start()
        self.nginx = nginx
        self.http = publishing_session()
        return self

    def __exit__(self, *exc) -> None:
        self.nginx.stop()

    def target(self) -> Target:
        return Target(self.name, "127.0.0.1", self.port, "/sub", opened_when=b"\n\n")

    def publish(self, text: str) -> None:
        self.http.post(f"http://127.0.0.1:{self.port}/pub", data=text, timeout=60).raise_for_status()

    def raw_publish(self) -> RawPublish:
        return RawPublish("127.0.0.1", self.port, "/pub", {}, str.encode)

    def server_pids(self) -> list[int]:
        return process_tree(self.nginx.process.pid)

    def redis_connections(self) -> int:
        return 0
