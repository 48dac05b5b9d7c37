"""Outgoing webhooks against real processes: gunicorn, the delivery process (`worker.py`), redis-server or
a local Redis Cluster, and HTTP receivers in the test process. Processes are shared per module; each test
uses its own channels and endpoints, so tests do not see each other's messages.

Which Redis: `outgoing_redis`, the session's one unless a module parametrises it (indirectly) with
`ON_BOTH` below; the cluster (3 primaries, 3 replicas) is started once for the whole folder.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import requests

from app import create_app
from app.apikeys.store import create_key
from app.auth.users import create_user
from tests.outgoing.receivers import DeliveryProcess, Receiver
from tests.servers import LiveServer, RedisClusterServer, wait_until
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

# Modules whose tests exercise the store's steps run against one redis-server and a Redis Cluster: the
# session's Redis when it is of that kind (tests/conftest.py may parametrise it over both), else a cluster
# started once for this folder. A case whose wanted kind differs from a parametrised session's is left out.
ON_BOTH = pytest.mark.parametrize("outgoing_redis", ["standalone", "cluster"], indirect=True, scope="module")
CLUSTER_ONLY = pytest.mark.parametrize("outgoing_redis", ["cluster"], indirect=True, scope="module")


def not_on_cluster(reason: str):
    """A test of such a module that exercises nothing of the store: run against one redis-server only."""
    return pytest.mark.not_on_cluster(reason=reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "not_on_cluster(reason): run against one redis-server only")


def pytest_collection_modifyitems(config, items):
    """Leave out cases whose Redis would be of the wrong kind, or a cluster for a test marked not_on_cluster."""
    left_out = []
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        wanted = params.get("outgoing_redis")
        if wanted is None:
            continue
        session = params.get("redis_server")  # set when the session's Redis is parametrised
        if (session is not None and session != wanted) or (
            wanted == "cluster" and item.get_closest_marker("not_on_cluster")
        ):
            left_out.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]


# Seconds-scale: a failure is retried after 1 s, then 2 s, then the message has failed.
FAST = {
    "WEBHOOK_OUT_ALLOW_PRIVATE": "true",  # the receivers are on loopback
    "WEBHOOK_OUT_ALLOW_HTTP": "true",
    "WEBHOOK_OUT_RETRY_SCHEDULE": "1,2",
    "WEBHOOK_OUT_TIMEOUT_SECONDS": "2",
    "WEBHOOK_OUT_CONNECT_TIMEOUT_SECONDS": "1",
    "WEBHOOK_OUT_ENDPOINT_CONCURRENCY": "2",
    "WEBHOOK_OUT_SECRET_OVERLAP_SECONDS": "3",
}


@dataclass
class Api:
    """The service's HTTP API as an administrator (or an API key) sees it."""

    url: str
    token: str

    def call(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {**bearer(self.token), **kwargs.pop("headers", {})}
        return requests.request(method, self.url + path, headers=headers, timeout=10, **kwargs)

    def create_endpoint(self, url: str, channels: list[str], **fields) -> dict:
        response = self.call("POST", "/admin/webhook-endpoints", json={"url": url, "channels": channels, **fields})
        assert response.status_code == 201, response.text
        return response.json()

    def publish(self, channel: str, event: str = "order.paid", data=None) -> str:
        body = {"channel": channel, "event": event, "data": data if data is not None else {"n": 1}}
        response = self.call("POST", "/events", json=body)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def messages(self, endpoint_id: str, status: str | None = None) -> list[dict]:
        params = {"status": status} if status else {}
        response = self.call("GET", f"/admin/webhook-endpoints/{endpoint_id}/messages", params=params)
        assert response.status_code == 200, response.text
        return response.json()["messages"]

    def message_with(self, endpoint_id: str, predicate, timeout: float = 15.0) -> dict:
        """Wait until the endpoint has exactly one message and it satisfies `predicate`."""

        def check():
            found = self.messages(endpoint_id)
            return found[0] if len(found) == 1 and predicate(found[0]) else None

        return wait_until(check, timeout=timeout, interval=0.1, message="message state")


def channel() -> str:
    """A channel of this test's own."""
    return f"orders-{uuid.uuid4().hex[:10]}"


def make_admin_and_key(env: dict) -> tuple[str, str]:
    """An administrator's e-mail and an API key with scope webhooks:manage, made in-process."""
    app = create_app(env)
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
        key, _ = create_key("webhooks test", ["webhooks:manage", "events:publish"], ["*"])
    return email, key


def login(server_url: str, email: str) -> str:
    response = requests.post(
        server_url + "/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()["access_token"]


@dataclass
class Service:
    """One running service: web server, delivery process(es), receiver, and the API as admin and as key."""

    web: LiveServer
    workers: list[DeliveryProcess]
    receiver: Receiver
    admin: Api
    key: Api
    env: dict
    email: str


@dataclass
class StoreRedis:
    """The Redis the outgoing tests' services use: a redis-server or a RedisClusterServer."""

    server: object

    @property
    def mode(self) -> str:
        return "cluster" if isinstance(self.server, RedisClusterServer) else "standalone"

    @property
    def url(self) -> str:
        return self.server.url

    def env(self) -> dict:
        return {"REDIS_URL": self.url, "REDIS_MODE": self.mode}

    def client(self):
        return self.server.client()

    def flushall(self) -> None:
        if self.mode == "cluster":
            self.server.flushall()
        else:
            self.server.client().flushall()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A local Redis Cluster for this folder, started on first use (about 6 s)."""
    cluster = RedisClusterServer(tmp_path_factory.mktemp("outgoing-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def outgoing_redis(request, redis_server) -> StoreRedis:
    """The session's Redis, unless the module asks for a cluster and the session's is one redis-server."""
    session = StoreRedis(redis_server)
    if getattr(request, "param", session.mode) == "cluster" and session.mode != "cluster":
        return StoreRedis(request.getfixturevalue("redis_cluster"))
    return session


@pytest.fixture
def rdb(outgoing_redis):
    """A clean database for each test (the folder's choice of Redis)."""
    outgoing_redis.flushall()
    return outgoing_redis.client()


@pytest.fixture
def make_app(base_env, rdb, outgoing_redis):
    def make(**overrides):
        return create_app({**base_env, **outgoing_redis.env(), **{k: str(v) for k, v in overrides.items()}})

    return make


@pytest.fixture(scope="module")
def receiver():
    started = Receiver().start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def make_service(base_env, outgoing_redis, tmp_path_factory, receiver):
    """Start a service with extra settings (web and delivery processes alike); stopped after the module."""
    started: list[Service] = []

    def make(workers: int = 1, worker_env: dict | None = None, web_workers: int = 1, **env) -> Service:
        """One service at a time: an earlier one's delivery processes would share the work (and the bound).

        One gunicorn worker unless asked: these tests are of the delivery processes, which take the web's events
        from Redis whichever worker wrote them, and a second worker's boot is a second of CPU per service."""
        while started:
            stop(started.pop())
        logs = tmp_path_factory.mktemp("outgoing")
        full = {**base_env, **outgoing_redis.env(), **FAST, "PROMETHEUS_MULTIPROC_DIR": str(logs / "metrics"), **env}
        if full["REDIS_URL"] == outgoing_redis.url:
            outgoing_redis.flushall()  # endpoints other modules left must not receive this one's events
        (logs / "metrics").mkdir()
        web = LiveServer(full, workers=web_workers, log_path=logs / "gunicorn.log")
        web.start()
        delivery = [
            DeliveryProcess({**full, **(worker_env or {})}, logs / f"worker-{n}.log").start() for n in range(workers)
        ]
        email, key = make_admin_and_key(full)
        service = Service(web, delivery, receiver, Api(web.url, login(web.url, email)), Api(web.url, key), full, email)
        started.append(service)
        return service

    def stop(service: Service) -> None:
        for worker in service.workers:
            if worker.process.poll() is None:
                worker.kill()  # quicker than waiting for held attempts; SIGTERM is tested in test_ssrf.py
        service.web.stop()

    yield make
    for service in started:
        stop(service)


@pytest.fixture(scope="module")
def service(make_service) -> Service:
    return make_service()
