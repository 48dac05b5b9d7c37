"""A Redis out of reach, as every process tells it: where it looked (host and port, and the setting they came
from), never the password, and retried with back-off instead of a log line a second."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import requests

from app import redis as app_redis
from app.redis import describe_redis, redis_addresses
from tests.servers import ROOT, VENV_BIN, free_port, process_env, wait_until

PASSWORD = "hunter2-password"


class RefusingRedis:
    """A port where a Redis should be: it takes each connection and closes it at once, counting them (so a test
    sees the retries that the log no longer tells one by one)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"
        self.attempts = 0
        threading.Thread(target=self._refuse, daemon=True).start()

    def _refuse(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.attempts += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


class Process:
    """One of the service's processes, started against `redis`, its log lines (JSON) in a file."""

    def __init__(self, command: list[str], redis: RefusingRedis, log_path: Path, **settings: str):
        env = process_env(APP_ENV="test", DATA_DIR=str(log_path.parent / "var"), REDIS_URL=redis.url, **settings)
        self.port = free_port()
        env.update(PORT=str(self.port), WEB_CONCURRENCY="1", LOG_LEVEL="info", PATH=f"{VENV_BIN}:/usr/bin:/bin")
        self.log_path = log_path
        with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def messages(self) -> list[dict]:
        """Every log line so far, parsed (each must be JSON)."""
        return [json.loads(line) for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def about_redis(line: dict) -> bool:
    """Whether a log line reports trouble with Redis (unreachable, lost, retried)."""
    text = line["msg"].lower()
    return "redis" in text or "connectionerror" in text


@pytest.fixture
def started(tmp_path):
    """Start a process against its own refusing Redis: (process, redis); both stopped at the end."""
    running = []

    def start(name: str, command: list[str], **settings: str) -> tuple[Process, RefusingRedis]:
        redis = RefusingRedis()
        (tmp_path / name).mkdir()
        running.append((Process(command, redis, tmp_path / name / "log", **settings), redis))
        return running[-1]

    yield start
    for process, redis in running:
        process.stop()
        redis.close()


def loggers_about_redis(process: Process) -> set[str]:
    """The loggers that have told of trouble with Redis so far."""
    return {line["logger"] for line in process.messages() if about_redis(line)}


@pytest.mark.slow
def test_the_web_and_delivery_processes_say_where_redis_is_missing_and_back_off(started):
    web, web_redis = started(
        "web", [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"], PRESENCE_TIMEOUT_SECONDS="1"
    )
    delivery, delivery_redis = started("delivery", [str(VENV_BIN / "python"), "worker.py"])
    base = f"http://127.0.0.1:{web.port}"
    wait_until(lambda: requests.get(f"{base}/healthz", timeout=5).ok, timeout=60, message="gunicorn")

    # Requests that need Redis: readiness, logins (answered 503, the presence keeper's reaper started by the
    # first), a metrics scrape (the outgoing webhooks' backlog is read from Redis).
    assert requests.get(f"{base}/readyz", timeout=10).status_code == 503
    for _ in range(3):
        login = {"email": "someone@example.com", "password": "correct horse battery"}
        assert requests.post(f"{base}/auth/login", json=login, timeout=10).status_code == 503
    assert requests.get(f"{base}/metrics", timeout=10).status_code == 200
    told = {"app.ops", "app.errors", "app.channels.presence", "app.outgoing.backlog", "app.mail.queue"}
    wait_until(lambda: told <= loggers_about_redis(web), timeout=60, message=f"lines of {told}")

    # Retries go on (each one a connection), told once per outage in the log: the web worker's mail sender
    # had written a line a second, with no word of where it looked.
    wait_until(lambda: web_redis.attempts >= 4, timeout=60, message="the mail sender's retries")
    wait_until(lambda: delivery_redis.attempts >= 30, timeout=60, message="the delivery loops' retries")
    for process, redis in ((web, web_redis), (delivery, delivery_redis)):
        lines = [line for line in process.messages() if about_redis(line)]
        assert lines, process.messages()
        for line in lines:
            assert f"127.0.0.1:{redis.port} (REDIS_URL)" in line["msg"], line
        assert PASSWORD not in process.log_path.read_text()
    for logger in ("app.mail.queue", "app.errors", "app.channels.presence", "app.outgoing.backlog"):
        # Once an outage (or a minute): three logins, a reaper pass every 0.1 s, make one line each.
        assert len([line for line in web.messages() if about_redis(line) and line["logger"] == logger]) == 1, logger
    # The delivery process's six loops: one line each when Redis went, not one per retry.
    told = [line["msg"] for line in delivery.messages() if about_redis(line)]
    assert len(told) == len(set(told)) <= 6, told


@pytest.mark.parametrize(
    "url, described",
    [
        ("redis://:secret@127.0.0.1:6390/0", "127.0.0.1:6390 (REDIS_URL)"),
        ("redis://localhost", "localhost:6379 (REDIS_URL)"),
        ("redis://:secret@10.0.0.1:7000,redis://:secret@10.0.0.2:7001", "10.0.0.1:7000, 10.0.0.2:7001 (REDIS_URL)"),
    ],
)
def test_a_redis_is_described_by_its_addresses_and_setting_never_its_password(url, described):
    assert describe_redis(url) == described
    assert "secret" not in redis_addresses(url)


@pytest.mark.not_on_cluster("the settings are read alike in both modes")
def test_a_redis_of_redis_tls_url_is_named_by_that_setting_as_the_settings_say(make_app, monkeypatch):
    monkeypatch.setattr(app_redis, "_url_setting", "REDIS_URL")  # put back after: later tests build no app
    tls = "rediss://user:secret@[::1]:6380/0"
    settings = make_app(REDIS_TLS_URL=tls, REDIS_MODE="standalone").config["SETTINGS"]  # not in os.environ
    assert settings.redis_url_setting == "REDIS_TLS_URL"
    assert describe_redis(settings.redis_url) == "[::1]:6380 (REDIS_TLS_URL)"


@pytest.mark.not_on_cluster("a Redis that is not there is the same in both modes")
def test_readiness_tells_where_it_found_no_redis_once_per_outage(make_app, caplog):
    dead = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    client = make_app(REDIS_URL=dead, REDIS_MODE="standalone").test_client()
    for _ in range(3):
        assert client.get("/readyz").status_code == 503
    told = [record.getMessage() for record in caplog.records if "readyz" in record.getMessage()]
    assert len(told) == 1 and f"{dead.rpartition('@')[2].split('/')[0]} (REDIS_URL)" in told[0], caplog.text
    assert PASSWORD not in caplog.text


@pytest.mark.not_on_cluster("a Redis that is not there is the same in both modes")
def test_requests_answered_503_tell_where_redis_is_missing_once_a_minute(make_app, caplog):
    dead = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    app = make_app(REDIS_URL=dead, REDIS_MODE="standalone")
    client = app.test_client()
    login = {"email": "someone@example.com", "password": "correct horse battery"}

    def told() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.name == "app.errors"]

    for _ in range(3):
        assert client.post("/auth/login", json=login).status_code == 503
    assert len(told()) == 1 and f"{dead.rpartition('@')[2].split('/')[0]} (REDIS_URL)" in told()[0], caplog.text
    app.extensions["failed_requests"].told -= 61  # a minute on: the next line counts those not told
    assert client.post("/auth/login", json=login).status_code == 503
    assert len(told()) == 2 and "; 2 more since the last such line, 61 s ago" in told()[1], told()
    assert PASSWORD not in caplog.text
