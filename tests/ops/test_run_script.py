"""`make run` for real (scripts/run.sh: Redis, gunicorn, nginx) and the real CLI beside it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from tests.events.clients import Api
from tests.servers import ROOT, VENV_BIN, free_port, process_env, wait_until

pytestmark = pytest.mark.not_on_cluster("tests `make run`, which starts its own single redis-server")


def clean_env(**extra: str) -> dict:
    """Nothing of the developer's shell: the script and the CLI must get their settings elsewhere."""
    env = process_env()
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    return {**env, "LOG_LEVEL": "info", **extra}


def listening_addresses(port: int) -> set[str]:
    """The local addresses of sockets listening on `port` (IPv4, from the kernel's table)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
            found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


def published_total(base: str) -> float:
    for line in requests.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith("rt_events_published_total "):
            return float(line.split()[1])
    raise AssertionError("rt_events_published_total missing from /metrics")


def flask_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI as the README has a developer type it: no REDIS_URL, only where `make run` keeps var/."""
    return subprocess.run(
        [str(VENV_BIN / "flask"), "--app", "wsgi", *args],
        cwd=ROOT,
        env=clean_env(DATA_DIR=str(data_dir)),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def make_run(tmp_path):
    """scripts/run.sh on free ports with its data under tmp_path, two workers, no secrets given."""
    data_dir = tmp_path / "var"
    ports = {"PORT": free_port(), "NGINX_PORT": free_port(), "REDIS_PORT": free_port()}
    output = tmp_path / "run.log"
    env = clean_env(DATA_DIR=str(data_dir), WEB_CONCURRENCY="2", **{k: str(v) for k, v in ports.items()})
    with open(output, "wb") as log:
        process = subprocess.Popen(
            ["scripts/run.sh"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    service = f"http://127.0.0.1:{ports['PORT']}"
    try:
        wait_until(lambda: requests.get(f"{service}/readyz", timeout=1).ok, timeout=30, message="make run")
        yield {"process": process, "data_dir": data_dir, "service": service, "output": output, **ports}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.mark.slow
def test_the_cli_reaches_make_runs_redis_and_its_events_are_counted(make_run):
    data_dir, service = make_run["data_dir"], make_run["service"]
    env_file = (data_dir / ".env").read_text()
    assert f"REDIS_URL=redis://127.0.0.1:{make_run['REDIS_PORT']}/0" in env_file
    assert f"PROMETHEUS_MULTIPROC_DIR={(data_dir / 'metrics').resolve()}" in env_file
    assert oct((data_dir / ".env").stat().st_mode & 0o777) == "0o600"  # it may hold a Redis password

    # nginx is the way in; both listen on loopback only (a development setup, with development secrets).
    assert listening_addresses(make_run["PORT"]) == {"127.0.0.1"}
    assert listening_addresses(make_run["NGINX_PORT"]) == {"127.0.0.1"}
    assert requests.get(f"http://127.0.0.1:{make_run['NGINX_PORT']}/healthz", timeout=5).ok

    reader = Api(service)
    cursor = reader.current_cursor()
    before = published_total(service)
    for n in ("1", "2"):
        result = flask_cli(data_dir, "events", "publish", "--channel", reader.channel, "--event", "cli.n", "--data", n)
        assert result.returncode == 0, result.stderr
        assert "development secrets" not in result.stderr  # announced once, by the server that made them
    events = reader.poll(cursor).json()["events"]
    assert [(e["event"], e["data"]) for e in events] == [("cli.n", 1), ("cli.n", 2)]
    # The CLI processes have exited; their counts stay in the sum /metrics serves.
    assert published_total(service) == before + 2

    users = flask_cli(data_dir, "users", "create", "--email", "ops@example.com", "--password", "long enough pw")
    assert users.returncode == 0, users.stderr
    assert requests.post(
        f"{service}/auth/login", json={"email": "ops@example.com", "password": "long enough pw"}, timeout=5
    ).ok

    output = make_run["output"].read_text()
    assert output.count("development secrets made") == 1, output  # two workers, one announcement


@pytest.mark.slow
def test_make_run_stops_everything_and_the_cli_then_names_its_redis(make_run):
    process = make_run["process"]
    process.send_signal(signal.SIGTERM)
    process.wait(30)
    # Nothing outlives the script: no process of its session is left.
    survivors = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _session_of(p) == process.pid]
    assert survivors == []

    result = flask_cli(make_run["data_dir"], "events", "publish", "--channel", "broadcast", "--event", "x")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"redis://127.0.0.1:{make_run['REDIS_PORT']}/0" in lines[0] and "REDIS_URL" in lines[0]


def _session_of(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rpartition(")")[2].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def test_the_environment_wins_over_the_env_file(tmp_path, redis_server, rdb):
    """A REDIS_URL in the shell beats the one `make run` wrote; the file fills in what is unset."""
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    (data_dir / ".env").write_text(f"# comment\nREDIS_URL={redis_server.url}\n")
    args = ["users", "create", "--email", "file@example.com", "--password", "long enough pw"]
    from_file = flask_cli(data_dir, *args)
    assert from_file.returncode == 0, from_file.stderr
    assert rdb.exists("user:email:file@example.com")

    overridden = subprocess.run(
        [str(VENV_BIN / "flask"), "--app", "wsgi", *args],
        cwd=ROOT,
        env=clean_env(DATA_DIR=str(data_dir), REDIS_URL=dead),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert overridden.returncode != 0 and dead in overridden.stderr
    assert "Traceback" not in overridden.stderr
