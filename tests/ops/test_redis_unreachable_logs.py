"""A Redis out of reach, as every process tells it: where it looked (host and port, and the setting they came
from), never the password, and retried with back-off instead of a log line a second."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest

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

    def __init__(self, command: list[str], redis: RefusingRedis, log_path: Path):
        env = process_env(APP_ENV="test", DATA_DIR=str(log_path.parent / "var"), REDIS_URL=redis.url)
        env.update(PORT=str(free_port()), WEB_CONCURRENCY="1", LOG_LEVEL="info", PATH=f"{VENV_BIN}:/usr/bin:/bin")
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

    def start(name: str, command: list[str]) -> tuple[Process, RefusingRedis]:
        redis = RefusingRedis()
        (tmp_path / name).mkdir()
        running.append((Process(command, redis, tmp_path / name / "log"), redis))
        return running[-1]

    yield start
    for process, redis in running:
        process.stop()
        redis.close()


@pytest.mark.slow
def test_the_web_and_delivery_processes_say_where_redis_is_missing_and_back_off(started):
    web, web_redis = started("web", [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"])
    delivery, delivery_redis = started("delivery", [str(VENV_BIN / "python"), "worker.py"])

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
    mail = [line for line in web.messages() if about_redis(line) and line["logger"] == "app.mail.queue"]
    assert len(mail) == 1, mail
    # The delivery process's six loops: one line each when Redis went, not one per retry.
    told = [line["msg"] for line in delivery.messages() if about_redis(line)]
    assert len(told) == len(set(told)) <= 6, told


@pytest.mark.parametrize(
    "url, environ, described",
    [
        ("redis://:secret@127.0.0.1:6390/0", {}, "127.0.0.1:6390 (REDIS_URL)"),
        ("redis://localhost", {}, "localhost:6379 (REDIS_URL)"),
        ("rediss://user:secret@[::1]:6380/0", {"REDIS_TLS_URL": "rediss://user:secret@[::1]:6380/0"}, None),
        ("redis://:secret@10.0.0.1:7000,redis://:secret@10.0.0.2:7001", {}, "10.0.0.1:7000, 10.0.0.2:7001 (REDIS_URL)"),
    ],
)
def test_a_redis_is_described_by_its_addresses_and_setting_never_its_password(monkeypatch, url, environ, described):
    monkeypatch.delenv("REDIS_TLS_URL", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert describe_redis(url) == (described or "[::1]:6380 (REDIS_TLS_URL)")
    assert "secret" not in redis_addresses(url)


@pytest.mark.not_on_cluster("a Redis that is not there is the same in both modes")
def test_readiness_tells_where_it_found_no_redis_once_per_outage(make_app, caplog):
    dead = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    client = make_app(REDIS_URL=dead, REDIS_MODE="standalone").test_client()
    for _ in range(3):
        assert client.get("/readyz").status_code == 503
    told = [record.getMessage() for record in caplog.records if "readyz" in record.getMessage()]
    assert len(told) == 1 and f"{dead.rpartition('@')[2].split('/')[0]} (REDIS_URL)" in told[0], caplog.text
    assert PASSWORD not in caplog.text
