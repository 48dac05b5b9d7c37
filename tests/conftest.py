"""Fixtures: a real redis-server for the session, the app and its test client, and a live gunicorn."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from app import create_app
from tests.servers import LiveServer, RedisServer
from tests.utils import AuthActions

TEST_SECRET_KEY = "test-secret-key-" + "k" * 32
TEST_JWT_SECRET = "test-jwt-secret-" + "j" * 32


@pytest.fixture(scope="session", autouse=True)
def no_request_raised_in_any_server():
    """After the whole suite: no gunicorn log holds a traceback (bad input never reaches one)."""
    yield
    raised = {}
    for log in LiveServer.logs:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Traceback (most recent call last)" in text:
            start = text.index("Traceback (most recent call last)")
            raised[str(log)] = text[max(0, start - 300) : start + 1500]
    assert not raised, "tracebacks in server logs:\n" + "\n\n".join(f"{k}:\n{v}" for k, v in raised.items())


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def base_env(redis_server, tmp_path_factory) -> dict:
    """Environment shared by in-process apps and live servers."""
    return {
        "APP_ENV": "test",
        "DATA_DIR": str(tmp_path_factory.mktemp("var")),
        "REDIS_URL": redis_server.url,
        "SECRET_KEY": TEST_SECRET_KEY,
        "JWT_SECRET": TEST_JWT_SECRET,
        "RATE_LIMITS_ENABLED": "false",
        "LOG_LEVEL": "warning",
    }


@pytest.fixture
def rdb(redis_server):
    """A clean database for each test."""
    client = redis_server.client()
    client.flushall()
    return client


@pytest.fixture
def make_app(base_env, rdb):
    def make(**overrides):
        return create_app({**base_env, **{k: str(v) for k, v in overrides.items()}})

    return make


@pytest.fixture
def app(make_app):
    return make_app()


class HttpsClient(FlaskClient):
    """A test client that speaks as https://localhost, so Secure cookies are kept and sent."""

    def open(self, *args, **kwargs):
        kwargs.setdefault("base_url", "https://localhost")
        return super().open(*args, **kwargs)


def https_client(app):
    app.test_client_class = HttpsClient
    return app.test_client()


@pytest.fixture
def client(app):
    return https_client(app)


@pytest.fixture
def auth(client):
    return AuthActions(client)


@pytest.fixture
def live_server(base_env, rdb, tmp_path):
    """A real gunicorn (gevent worker) serving the app, stopped after the test."""
    server = LiveServer(base_env, log_path=tmp_path / "gunicorn.log")
    server.start()
    yield server
    server.stop()
