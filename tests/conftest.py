"""Fixtures: the session's real Redis (one server, then a local cluster), the app, its test client, a live gunicorn."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from playwright.sync_api import sync_playwright
from werkzeug.routing.rules import Rule

from app import create_app
from app.auth.users import create_user
from tests.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.servers import LiveServer, RedisClusterServer, RedisServer
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email

# pytest keeps each test file as rewritten and compiled in its __pycache__ (ignored by git) even where
# PYTHONDONTWRITEBYTECODE is set, as on the machines this suite runs on: every test process collects every test
# file, and rewriting and compiling them all again took 7 of its 14 s of CPU for collection.
sys.dont_write_bytecode = False

TEST_SECRET_KEY = "test-secret-key-" + "k" * 32
TEST_JWT_SECRET = "test-jwt-secret-" + "j" * 32
OWASP_HASHING = {"PASSWORD_HASH_COST": "owasp"}  # production's cost, for tests of the hashing itself


def _share_url_builders_between_apps() -> None:
    """Compile each route's URL builder once per test process, not once per app the suite builds.

    Werkzeug writes, compiles and execs a small Python function for every route of every new app: two thirds
    of the 65 ms `create_app` takes, and the suite builds an app for most of its 2,000 tests. The function is
    made from the rule's text and its parsed parts only, and reads the rule's converters from the rule it is
    bound to when called, so the one made for an identical rule of an earlier app is the same function. A rule
    whose defaults fill a variable part bakes a converter's output in: those are compiled as before.
    """
    original = Rule._compile_builder
    builders: dict[tuple, Callable] = {}

    def compile_builder(self: Rule, append_unknown: bool = True) -> Callable:
        defaults = self.defaults or {}
        if defaults and any(is_variable and part in defaults for is_variable, part in self._trace):
            return original(self, append_unknown)
        key = (self.rule, tuple(self._trace), tuple(sorted(defaults)), append_unknown)
        if key not in builders:
            builders[key] = original(self, append_unknown)
        return builders[key]

    Rule._compile_builder = compile_builder


_share_url_builders_between_apps()


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


REDIS_MODES = ("standalone", "cluster")
NOT_ON_CLUSTER = "not_on_cluster"
CLUSTER_ONLY = "cluster_only"


def pytest_addoption(parser):
    parser.addoption(
        "--redis-mode",
        choices=(*REDIS_MODES, "both"),
        default="both",
        help="Run the Redis-touching tests against one redis-server, a local Redis Cluster, or both (default).",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{NOT_ON_CLUSTER}(reason): the test cannot apply to a Redis Cluster (it starts its own redis-server, "
        "tests a proxy or the browser page...); it runs against one redis-server only",
    )
    config.addinivalue_line("markers", f"{CLUSTER_ONLY}: the test is about the cluster; it runs against it only")


def pytest_collection_modifyitems(config, items):
    """Drop the cases of a Redis mode not asked for, and those a test's marker rules out."""
    wanted = config.getoption("--redis-mode")
    kept, dropped = [], []
    for item in items:
        mode = getattr(item, "callspec", None) and item.callspec.params.get("redis_server")
        marker = item.get_closest_marker(NOT_ON_CLUSTER)
        if marker is not None and not (marker.args or marker.kwargs.get("reason")):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{NOT_ON_CLUSTER} needs a reason")
        ruled_out = (mode == "cluster" and marker is not None) or (
            mode == "standalone" and item.get_closest_marker(CLUSTER_ONLY) is not None
        )
        if mode and ((wanted != "both" and mode != wanted) or ruled_out):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def redis_servers(tmp_path_factory):
    """The session's Redis servers by mode, each started on first use and stopped at the session's end.

    Kept apart from the parametrised `redis_server`: pytest finishes a parametrised session fixture
    whenever the next test wants the other mode, which happens at every test file under pytest-xdist
    (a process runs one file's tests of both modes, then the next file's). The servers stay up.
    """
    servers: dict[str, RedisServer | RedisClusterServer] = {}

    def get(mode: str):
        if mode not in servers:
            if mode == "cluster":
                server = RedisClusterServer(tmp_path_factory.mktemp("redis-cluster"))
            else:
                server = RedisServer(tmp_path_factory.mktemp("redis"))
            server.mode = mode
            server.start()
            servers[mode] = server
        return servers[mode]

    yield get
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="session", params=REDIS_MODES)
def redis_server(request, redis_servers):
    """The session's Redis: one redis-server, or a local Redis Cluster (3 primaries, 3 replicas).

    Every test that touches Redis (through `base_env`, `rdb` or this) runs once against each.
    """
    return redis_servers(request.param)


@pytest.fixture(scope="session")
def redis_mode(redis_server) -> str:
    """'standalone' or 'cluster': what the session's Redis is."""
    return redis_server.mode


@pytest.fixture(scope="session")
def base_env(redis_server, tmp_path_factory) -> dict:
    """Environment shared by in-process apps and live servers."""
    return {
        "APP_ENV": "test",
        "DATA_DIR": str(tmp_path_factory.mktemp("var")),
        "REDIS_URL": redis_server.url,
        "REDIS_MODE": redis_server.mode,
        "SECRET_KEY": TEST_SECRET_KEY,
        "JWT_SECRET": TEST_JWT_SECRET,
        "RATE_LIMITS_ENABLED": "false",
        "LOG_LEVEL": "warning",
        # Argon2 at its lowest cost: the suite's thousands of accounts would take minutes of CPU at OWASP's.
        # The tests of the hashing itself ask for OWASP's (OWASP_HASHING).
        "PASSWORD_HASH_COST": "minimal",
    }


@pytest.fixture(scope="session")
def _session_client(redis_server):
    return redis_server.client()


@pytest.fixture
def rdb(redis_server, _session_client):
    """A clean database for each test (every primary flushed on a cluster), and a client for it."""
    if redis_server.mode == "cluster":
        redis_server.flushall()
    else:
        _session_client.flushall()
    return _session_client


@pytest.fixture
def make_app(base_env, rdb):
    def make(**overrides):
        return create_app({**base_env, **{k: str(v) for k, v in overrides.items()}})

    return make


@pytest.fixture
def app(make_app):
    return make_app()


Cli = Callable[..., subprocess.CompletedProcess]


def run_cli(app: Flask, *args: str) -> subprocess.CompletedProcess:
    """`flask --app wsgi ARGS...` run in this process on `app`: its status, stdout and stderr, as a subprocess's.

    A command that raises (anything but SystemExit, which is how click reports a refusal) fails the test with
    its own traceback, where a subprocess would only have printed one.
    """
    with app.app_context():  # what `flask --app wsgi` pushes around every command
        done = app.test_cli_runner().invoke(args=list(args))
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        done.exception.add_note(f"flask {' '.join(args)}\nstdout: {done.stdout}\nstderr: {done.stderr}")
        raise done.exception
    return subprocess.CompletedProcess(["flask", "--app", "wsgi", *args], done.exit_code, done.stdout, done.stderr)


@pytest.fixture
def cli(app) -> Cli:
    """Run an operator command in process: `cli("users", "list")` is `flask --app wsgi users list`.

    For tests of what a command does (its effect, output and exit status): the command's code is the same, and
    it saves the 1.5-2 s a new interpreter takes to import and build the app. What only the real process shows
    (wsgi.py and envfiles.py loading settings, configuration errors, log lines on its stderr) keeps its
    subprocess tests, in tests/test_settings_and_cli.py and tests/ops/.
    """
    return lambda *args: run_cli(app, *args)


@pytest.fixture(scope="module")
def module_cli(base_env) -> Cli:
    """`cli` for module-scoped fixtures: an app of its own on the session's Redis (no `rdb`: nothing flushed)."""
    own = create_app(dict(base_env))
    return lambda *args: run_cli(own, *args)


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
def admin_headers(app, auth) -> dict:
    """The Authorization header of a fresh administrator, signed in with tokens in the body."""
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin", email_verified=True)
    return bearer(auth.login_body(email)["access_token"])


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


@pytest.fixture(scope="session")
def browser():
    """Chromium, launched once per test process (Playwright's sync API runs one instance per thread)."""
    assert Path(CHROMIUM).exists(), "Chromium is required (make test installs Debian's chromium-headless-shell)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()
