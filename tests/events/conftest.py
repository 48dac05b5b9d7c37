"""Live servers for the delivery tests: gunicorn (gevent worker) with quick heartbeats and time-outs."""

from __future__ import annotations

import pytest

from tests.conftest import TEST_JWT_SECRET, TEST_SECRET_KEY
from tests.servers import LiveServer, RedisClusterServer

FAST = {
    "SSE_HEARTBEAT_SECONDS": "0.5",
    "LONG_POLL_TIMEOUT_SECONDS": "2",
    "EVENT_HISTORY_MAXLEN": "1000",
    "WS_SEND_QUEUE": "1000",
    "WS_SEND_TIMEOUT_SECONDS": "2",
}


def pytest_configure(config):
    # Also registered by tests/conftest.py where the session's Redis is parametrised over both modes.
    config.addinivalue_line("markers", "not_on_cluster(reason): runs against one redis-server only")


def own_redis_env(directory, **env: str) -> dict:
    """A service environment for a module that starts its own Redis (or cluster): not the session's."""
    return {
        "APP_ENV": "test",
        "DATA_DIR": str(directory),
        "SECRET_KEY": TEST_SECRET_KEY,
        "JWT_SECRET": TEST_JWT_SECRET,
        "RATE_LIMITS_ENABLED": "false",
        "LOG_LEVEL": "warning",
        **FAST,
        **env,
    }


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    """A Redis Cluster of the module's own (3+3), for tests that kill nodes or move slots."""
    cluster = RedisClusterServer(tmp_path_factory.mktemp("cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


def start_on_cluster(cluster: RedisClusterServer, tmp_path_factory, workers: int) -> LiveServer:
    """gunicorn on `cluster` with EVENT_DURABILITY=replicated (the caller stops it)."""
    env = own_redis_env(
        tmp_path_factory.mktemp("var"), REDIS_MODE="cluster", REDIS_URL=cluster.url, EVENT_DURABILITY="replicated"
    )
    live = LiveServer(env, workers=workers, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    return live


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """Two workers, as in production: tests run against whichever worker the kernel picks."""
    live = LiveServer({**base_env, **FAST}, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.fixture
def start_server(base_env, tmp_path):
    """Start servers with extra settings; all stopped after the test."""
    started = []

    def start(workers: int = 1, **env):
        live = LiveServer(
            {**base_env, **FAST, **env}, workers=workers, log_path=tmp_path / f"gunicorn-{len(started)}.log"
        )
        live.start()
        started.append(live)
        return live

    yield start
    for live in started:
        live.stop()
