"""gunicorn.conf.py in a real gunicorn: every log line JSON, no metrics directory left behind, and a
worker count from the CPUs the process may really use."""

from __future__ import annotations

import glob
import json
import logging
import os
import resource
import runpy
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.events.clients import SSE, Api
from tests.servers import ROOT, VENV_BIN, LiveServer, RedisServer, process_env, wait_until

pytestmark = pytest.mark.not_on_cluster("tests gunicorn's process model and logs, and starts its own redis-server")

CONFIG = ROOT / "gunicorn.conf.py"


@pytest.fixture
def own_redis(tmp_path):
    """A Redis this test may stop and start again."""
    server = RedisServer(tmp_path / "redis-data")
    server.directory.mkdir()
    server.start()
    yield server
    server.stop()


def test_every_line_is_json_including_gunicorns_and_the_hubs_warnings(base_env, own_redis, tmp_path):
    log_path = tmp_path / "gunicorn.log"
    server = LiveServer({**base_env, "REDIS_URL": own_redis.url, "LOG_LEVEL": "info"}, workers=2, log_path=log_path)
    server.start()
    try:
        user = Api(server.url)
        user.wait(user.current_cursor(), timeout=0.1)  # a long poll starts the worker's event hub
        own_redis.stop()
        wait_until(lambda: "event hub lost redis" in log_path.read_text(), timeout=15, message="hub warning")
        own_redis.start()
        wait_until(lambda: "event hub reconnected" in log_path.read_text(), timeout=15, message="hub reconnect")
    finally:
        server.stop()

    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    by_logger = {line.get("logger") for line in lines}
    assert {"gunicorn.error", "app.events.hub", "access"} <= by_logger
    assert all({"ts", "level", "msg"} <= line.keys() for line in lines)
    hub = [line for line in lines if line["logger"] == "app.events.hub"]
    assert hub[0]["level"] == "warning" and hub[0]["msg"].startswith("event hub lost redis")
    assert any(line["msg"].startswith("Booting worker") for line in lines)


def test_the_temporary_metrics_and_carry_over_directories_are_removed_on_exit(base_env, rdb, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**base_env, "TMPDIR": str(tmp), "PROMETHEUS_MULTIPROC_DIR": ""}
    server = LiveServer(env, workers=2, log_path=tmp_path / "gunicorn.log")
    server.start()
    try:
        made = list(tmp.glob("auth-rt-metrics-*"))
        assert len(made) == 1 and list(made[0].glob("*.db"))  # the workers write their metrics there
        Api(server.url)  # some traffic, so the summed metrics are not empty

        # Where the workers take streams on a reload: /tmp, as this TMPDIR is too long for a Unix socket's path.
        carry_dir = {path.parent for path in wait_booted(server)}
        assert len(carry_dir) == 1
    finally:
        server.stop()
    assert list(tmp.glob("auth-rt-metrics-*")) == []
    assert not any(directory.exists() for directory in carry_dir)


def booted(server: LiveServer, workers: int = 2) -> list[Path] | None:
    """The carry-over sockets of the server's workers once each has one (made when a worker has booted)."""
    pattern = "/tmp/auth-rt-carry-*/*-{}.sock"  # noqa: S108
    sockets = [Path(path) for pid in server.worker_pids() for path in glob.glob(pattern.format(pid))]
    return sockets if len(sockets) == workers else None


def wait_booted(server: LiveServer) -> list[Path]:
    """`booted`, waited for: 30 s, as a loaded machine once took more than 10 for a second worker's app to load."""
    return wait_until(lambda: booted(server), timeout=30, message="both workers booted")


def idle_keep_alive(server: LiveServer) -> socket.socket:
    """A connection whose one request was answered and kept alive: waiting for its next request."""
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert idle.recv(65536).startswith(b"HTTP/1.1 200")
    return idle


def test_a_stop_closes_keep_alive_connections_waiting_for_a_request_at_once(base_env, tmp_path):
    server = LiveServer({**base_env, "GRACEFUL_TIMEOUT": "60"}, workers=1, log_path=tmp_path / "gunicorn.log")
    server.start()
    try:
        idle = idle_keep_alive(server)
        server.signal(signal.SIGTERM)
        # Left open, the idle connection held the worker for all of its 60 s graceful time-out.
        server.process.wait(20)
        assert idle.recv(65536) == b""
    finally:
        server.stop()


def test_a_quick_shutdown_ends_every_worker_at_once_without_a_traceback(base_env, rdb, tmp_path):
    """SIGQUIT to the arbiter alone (gunicorn's quick shutdown; the tests' servers are stopped otherwise): both
    booted workers, holding a stream and an idle keep-alive connection between them, exit by themselves at once,
    with status 0 and no traceback in the log (worker_int stops its main loop before gunicorn's own handler
    would, in the interpreter's shutdown)."""
    log_path = tmp_path / "gunicorn.log"
    server = LiveServer({**base_env, "LOG_LEVEL": "info"}, workers=2, log_path=log_path)
    server.start()
    try:
        user = Api(server.url)
        stream = SSE(server.url, user.auth)
        stream.next(skip_comments=False)
        idle = idle_keep_alive(server)
        wait_booted(server)  # a booting worker ignores the quit
        workers = server.worker_pids()
        started = time.monotonic()
        server.signal(signal.SIGQUIT)
        assert server.process.wait(20) == 0
        assert time.monotonic() - started < 8  # not the 10 s graceful time-out, nor a kill after it
        assert idle.recv(65536) == b""
        assert stream.closed.wait(5)
    finally:
        server.stop()
    log = log_path.read_text()
    assert "Traceback" not in log, log
    for pid in workers:  # each exited by itself, none killed by the arbiter
        assert f"Worker (pid:{pid}) was sent" not in log, log
        assert f"Worker (pid:{pid}) exited with code" not in log, log
    assert "Shutting down: Master" in log


@pytest.mark.parametrize("cpus, expected", [("0", 1), (None, len(os.sched_getaffinity(0)))])
def test_workers_default_to_the_cpus_the_process_may_use(cpus, expected):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two usable CPUs to tell a pinned process from an unpinned one")
    command = [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "--print-config", "wsgi:app"]
    if cpus is not None:
        command = ["taskset", "-c", cpus, *command]
    env = process_env()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    workers = next(line for line in result.stdout.splitlines() if line.startswith("workers "))
    assert workers.split("=")[1].strip() == str(expected)


@pytest.mark.parametrize("soft_limit, expected", [(1000, 900), (20000, 19900), (40000, 20000)])
def test_connections_per_worker_stay_within_the_descriptor_limit(soft_limit, expected):
    """gunicorn's own view of its settings, started under a given `ulimit -n` (soft limit)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < soft_limit:
        soft_limit, expected = hard, min(20000, hard - 100)
    command = [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "--print-config", "wsgi:app"]
    env = {key: value for key, value in process_env().items() if key != "WORKER_CONNECTIONS"}
    result = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft_limit, hard)),
    )
    connections = next(line for line in result.stdout.splitlines() if line.startswith("worker_connections "))
    assert connections.split("=")[1].strip() == str(expected)


@pytest.mark.parametrize(
    "cpu_max, cap", [("max 100000\n", None), ("50000 100000\n", 1), ("150000 100000\n", 2), (None, None)]
)
def test_a_cgroup_cpu_quota_caps_the_worker_count(tmp_path, cpu_max, cap):
    usable_cpus = _config()["usable_cpus"]
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(str(path)) == (affinity if cap is None else min(affinity, cap))


def _config() -> dict:
    """gunicorn.conf.py's names, as gunicorn loads them (its logging side effect undone after)."""
    try:
        return runpy.run_path(str(CONFIG))
    finally:
        logging.captureWarnings(False)


def test_gunicorn_builds_no_access_line_of_its_own():
    """The app writes one JSON line per request; gunicorn's line would be built and dropped."""
    from gunicorn.glogging import Logger

    enabled = type("Enabled", (), {"access_log_enabled": True, "atoms": Logger.atoms})()
    with pytest.raises(AttributeError):  # what gunicorn's own access() does with these: it builds the line
        Logger.access(enabled, None, None, None, 0.1)
    logger_class = _config()["logger_class"]
    assert logger_class.access(enabled, None, None, None, 0.1) is None


def test_a_scrape_passes_over_a_metrics_file_another_process_has_only_just_created(tmp_path, monkeypatch):
    """prometheus_client creates a process's file and sizes it a moment later: a scrape in between must
    still give every other process's values."""
    from app.metrics import render

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # as in a worker
    count = "from prometheus_client import Counter; Counter('probe', 'A probe.').inc(3)"
    env = {**process_env(), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([str(VENV_BIN / "python"), "-c", count], env=env, check=True, timeout=60)
    assert b"probe_total 3.0" in render(str(tmp_path))[0]
    (tmp_path / "gauge_livesum_99999.db").touch()  # created, not yet sized
    assert b"probe_total 3.0" in render(str(tmp_path))[0]
