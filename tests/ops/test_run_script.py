"""`make run` for real (scripts/run.sh: Redis, the mail catcher, gunicorn, the delivery process, nginx), the
real CLI and delivery process beside it, and the settings files all of them read."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from app.redis import Keys
from tests.events.clients import Api
from tests.servers import ROOT, VENV_BIN, free_port, process_env, wait_until

pytestmark = pytest.mark.not_on_cluster("tests `make run`, which starts its own single redis-server")

#: The order `make run` stops its processes in: Redis last, once nothing is left that uses it.
STOP_ORDER = ("nginx", "gunicorn", "delivery process", "mail catcher", "redis")
#: What a process that lost its Redis while stopping writes (the stop used to end them all at once).
REDIS_TROUBLE = ("unavailable", "reconnect", "ConnectionError", "cannot reach redis", "Traceback")


def clean_env(**extra: str) -> dict:
    """Nothing of the developer's shell, nor of their .env: the script and the CLI must get their settings
    from where each test says."""
    env = process_env()
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    return {**env, "LOG_LEVEL": "info", "ENV_FILE": "", **extra}


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


def flask_cli(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The CLI as the README has a developer type it: no REDIS_URL, only where `make run` keeps var/."""
    return subprocess.run(
        [str(VENV_BIN / "flask"), "--app", "wsgi", *args],
        cwd=ROOT,
        env=clean_env(DATA_DIR=str(data_dir), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


class MakeRun:
    """scripts/run.sh on free ports with its data under a temporary directory; `output` is its console."""

    def __init__(self, directory: Path, workers: int = 2, **env: str):
        self.data_dir = directory / "var"
        names = ("PORT", "NGINX_PORT", "REDIS_PORT", "MAILCATCHER_PORT", "MAILCATCHER_WEB_PORT")
        self.ports = {name: free_port() for name in names}
        self.output = directory / "run.log"
        self.plain = not env  # nothing set but ports and workers: make run's own defaults
        self.env = clean_env(
            DATA_DIR=str(self.data_dir),
            WEB_CONCURRENCY=str(workers),
            **{k: str(v) for k, v in self.ports.items()},
            **env,
        )
        with open(self.output, "wb") as log:  # the child keeps its own copy of the descriptor
            # As from a terminal: SIGINT not ignored (a shell's background jobs inherit it ignored, and a script
            # cannot trap a signal ignored when it starts), in a process group of its own.
            self.process = subprocess.Popen(
                ["env", "--default-signal=INT", "scripts/run.sh"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.service = f"http://127.0.0.1:{self.ports['PORT']}"
        self.nginx = f"http://127.0.0.1:{self.ports['NGINX_PORT']}"
        wait_until(lambda: requests.get(f"{self.nginx}/readyz", timeout=1).ok, timeout=30, message="make run")

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL to the script and to every process it started (each runs in a session of its own), all at
        once: for a module done with it, where how `make run` stops in order is not what is tested (it is here)."""
        if self.process.poll() is not None:
            return
        for pid in [*descendants(self.process.pid), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture(scope="module")
def _make_runs(tmp_path_factory):
    """The module's `make run`s, one running at a time: each start is some 6 s of CPU (Redis, the mail catcher,
    gunicorn and its workers, the delivery process, nginx), and a test that only looks at one, or ends it, needs
    no fresh one of its own. `running(plain=True)` is the running one if it has nothing set, else a new one;
    `start(**env)` starts one with these settings. Only the first has two gunicorn workers (the test of the one
    announcement of development secrets needs two); the others have one, which is all their tests look at."""
    started: list[MakeRun] = []

    def start(**env: str) -> MakeRun:
        for run in started:
            run.stop()
        started.append(MakeRun(tmp_path_factory.mktemp("make-run"), workers=1 if started else 2, **env))
        return started[-1]

    def running(plain: bool = True) -> MakeRun:
        if not started or started[-1].process.poll() is not None or (plain and not started[-1].plain):
            return start()
        return started[-1]

    running.start = start
    yield running
    for run in started:
        run.stop()


@pytest.fixture
def plain_make_run(_make_runs) -> MakeRun:
    """A running `make run` with nothing set, maybe one an earlier test of the module used (never one it stopped)."""
    return _make_runs()


@pytest.fixture
def any_make_run(_make_runs) -> MakeRun:
    """A running `make run`, maybe one an earlier test of the module started with settings of its own."""
    return _make_runs(plain=False)


@pytest.mark.slow
def test_make_run_sets_up_mail_and_webhooks_on_this_machine_with_nothing_typed(plain_make_run):
    run = plain_make_run
    ports = run.ports
    defaults = dict(line.split("=", 1) for line in (run.data_dir / ".env").read_text().splitlines() if "=" in line)
    assert {name: defaults.get(name) for name in ("SMTP_URL", "SMTP_STARTTLS", "PUBLIC_BASE_URL")} == {
        "SMTP_URL": f"smtp://127.0.0.1:{ports['MAILCATCHER_PORT']}",
        "SMTP_STARTTLS": "never",
        "PUBLIC_BASE_URL": f"http://127.0.0.1:{ports['NGINX_PORT']}",
    }
    assert defaults["WEBHOOK_OUT_ALLOW_HTTP"] == defaults["WEBHOOK_OUT_ALLOW_PRIVATE"] == "true"
    # Passkeys at localhost: browsers take no IP address as the domain a passkey belongs to.
    assert (defaults["WEBAUTHN_RP_ID"], defaults["WEBAUTHN_ORIGINS"]) == (
        "localhost",
        f"http://localhost:{ports['NGINX_PORT']}",
    )
    # The catcher takes mail and shows it on loopback only.
    assert listening_addresses(ports["MAILCATCHER_PORT"]) == {"127.0.0.1"}
    assert listening_addresses(ports["MAILCATCHER_WEB_PORT"]) == {"127.0.0.1"}
    page = requests.get(f"http://127.0.0.1:{ports['MAILCATCHER_WEB_PORT']}/", timeout=5)
    # The module's first test on the shared run, before any other has made the service send a mail.
    assert page.ok and "No mail yet" in page.text
    assert f"mail:    smtp://127.0.0.1:{ports['MAILCATCHER_PORT']}" in run.log()


@pytest.mark.slow
def test_the_cli_reaches_make_runs_redis_and_its_events_are_counted(plain_make_run):
    run = plain_make_run
    data_dir, service = run.data_dir, run.service
    env_file = (data_dir / ".env").read_text()
    assert f"REDIS_URL=redis://127.0.0.1:{run.ports['REDIS_PORT']}/0" in env_file
    assert f"PROMETHEUS_MULTIPROC_DIR={(data_dir / 'metrics').resolve()}" in env_file
    assert oct((data_dir / ".env").stat().st_mode & 0o777) == "0o600"  # it may hold a Redis password

    # nginx is the way in; both listen on loopback only (a development setup, with development secrets).
    assert listening_addresses(run.ports["PORT"]) == {"127.0.0.1"}
    assert listening_addresses(run.ports["NGINX_PORT"]) == {"127.0.0.1"}
    assert requests.get(f"{run.nginx}/healthz", timeout=5).ok

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

    output = run.log()
    assert run.env["WEB_CONCURRENCY"] == "2"
    assert output.count("development secrets made") == 1, output  # two workers, one announcement
    # The reader's idle keep-alive connection to gunicorn would hold its graceful stop (the teardown's) for
    # the whole graceful_timeout: closed here, as a client that has finished would.
    reader.http.close()


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid`, by the part of `make run` it belongs to (STOP_ORDER's names)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        todo += children.get(child, [])
        try:
            command = (Path(f"/proc/{child}") / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        for part, marker in (
            ("redis", "redis-server"),
            ("mail catcher", "scripts/mailcatcher.py"),
            ("gunicorn", "gunicorn"),
            ("delivery process", "worker.py"),
            ("nginx", "nginx"),
        ):
            if marker in command:
                found[child] = part
                break
    return found


def pidfds(processes: dict[int, str]) -> dict[int, int]:
    """A pidfd per process (fd -> pid): it turns readable when the process exits, whoever its parent is."""
    return {os.pidfd_open(pid): pid for pid in processes}


def exit_order(watched: dict[int, int], timeout: float) -> dict[int, int]:
    """pid -> the round in which its pidfd was seen readable. Processes seen in one round may have exited in
    any order; those of a later round exited later. The pidfds are closed."""
    poller = select.poll()
    for fd in watched:
        poller.register(fd, select.POLLIN)
    rounds: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    count = 0
    try:
        while len(rounds) < len(watched) and time.monotonic() < deadline:
            ready = poller.poll(max(1, int((deadline - time.monotonic()) * 1000)))
            count += 1
            for fd, _ in ready:
                rounds[watched[fd]] = count
                poller.unregister(fd)
    finally:
        for fd in watched:
            os.close(fd)
    assert len(rounds) == len(watched), f"still running: {[p for p in watched.values() if p not in rounds]}"
    return rounds


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_make_run_stops_in_order_redis_last_and_exits_0(plain_make_run, how):
    """Ctrl-C reaches the whole foreground process group from the terminal; make forwards SIGTERM to the script."""
    run = plain_make_run
    processes = descendants(run.process.pid)
    assert set(processes.values()) == set(STOP_ORDER), processes
    watched = pidfds(processes)  # before the signal: nginx, first, is gone at once
    mark = len(run.output.read_bytes())
    if how == "ctrl-c":
        os.killpg(run.process.pid, signal.SIGINT)
    else:
        run.process.send_signal(signal.SIGTERM)
    rounds = exit_order(watched, timeout=60)
    assert run.process.wait(30) == 0

    # In STOP_ORDER, and Redis strictly after everything that uses it.
    seen = {part: [rounds[pid] for pid, p in processes.items() if p == part] for part in STOP_ORDER}
    for earlier, later in zip(STOP_ORDER, STOP_ORDER[1:], strict=False):
        assert max(seen[earlier]) <= min(seen[later]), (earlier, later, seen)
    assert min(seen["redis"]) > max(seen["gunicorn"] + seen["delivery process"]), seen

    after = run.output.read_bytes()[mark:].decode(errors="replace")
    assert "make run: stopped" in after, after
    complaints = [
        line
        for line in after.splitlines()
        if any(word in line for word in REDIS_TROUBLE)
        or (line.startswith("{") and json.loads(line)["level"] in ("warning", "error", "critical"))
    ]
    assert complaints == [], after

    # Its Redis is gone with it; the CLI (reading make run's var/.env) names the one it cannot reach.
    result = flask_cli(run.data_dir, "events", "publish", "--channel", "broadcast", "--event", "x")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"cannot reach Redis at 127.0.0.1:{run.ports['REDIS_PORT']} (REDIS_URL)" in lines[0], lines


@pytest.mark.slow
def test_make_run_reads_the_developers_env_file_beneath_the_environment(tmp_path, _make_runs):
    """.env is kept across restarts; the environment wins over it, and it wins over make run's defaults."""
    env_file = tmp_path / "developer.env"
    env_file.write_text(
        "# kept across restarts\n"
        "ALLOWED_ORIGINS=http://127.0.0.1:9000\n"
        "export WEBHOOK_OUT_ALLOW_PRIVATE='false'\n"  # the production rule, for once
        "SMTP_URL=\n"  # set to nothing: mail to the log, no catcher
        "PORT=1\n"  # the environment's PORT wins
    )
    run = _make_runs.start(ENV_FILE=str(env_file))
    origin = {"Origin": "http://127.0.0.1:9000"}
    assert requests.get(f"{run.service}/healthz", headers=origin, timeout=5).headers.get(
        "Access-Control-Allow-Origin"
    ) == ("http://127.0.0.1:9000")

    written = (run.data_dir / ".env").read_text()
    assert "WEBHOOK_OUT_ALLOW_HTTP=true" in written  # a default .env leaves alone
    for name in ("SMTP_URL", "SMTP_STARTTLS", "WEBHOOK_OUT_ALLOW_PRIVATE"):
        assert f"\n{name}=" not in written, written
    assert listening_addresses(run.ports["MAILCATCHER_PORT"]) == set()
    assert "mail sender started; mail goes to the log" in run.log()

    # The CLI reads the same .env: it made an API key whose endpoint at a loopback address is refused.
    key = flask_cli(run.data_dir, "api-keys", "create", "--name", "hooks", "--scope", "webhooks:manage")
    assert key.returncode == 0, key.stderr
    answer = requests.post(
        f"{run.nginx}/admin/webhook-endpoints",
        headers={"Authorization": f"Bearer {key.stdout.split()[0]}"},
        json={"url": f"http://127.0.0.1:{free_port()}/", "channels": ["broadcast"]},
        timeout=5,
    )
    assert answer.status_code == 422 and "WEBHOOK_OUT_ALLOW_PRIVATE=true" in answer.text, answer.text


@pytest.mark.slow
def test_make_run_ends_when_one_of_its_processes_does(any_make_run):
    """A process that exits by itself (here the delivery process) ends `make run`, with the others, saying so.
    After the test of the developer's .env, whose `make run` it ends (any will do)."""
    run = any_make_run
    processes = descendants(run.process.pid)
    watched = pidfds(processes)
    [worker] = [pid for pid, part in processes.items() if part == "delivery process"]
    os.kill(worker, signal.SIGTERM)
    exit_order(watched, timeout=60)  # every one of them
    assert run.process.wait(30) == 1
    assert "make run: the delivery process exited (status 0); stopping the rest" in run.log()


def test_the_environment_wins_over_the_env_files(tmp_path, redis_server, rdb):
    """The CLI: a variable in the environment beats .env, which beats the one `make run` wrote; each file
    fills in only what the layers above leave unset."""
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    dead_port = free_port()
    dead = f"redis://127.0.0.1:{dead_port}/0"
    developer = tmp_path / "developer.env"
    args = ["users", "create", "--email", "file@example.com", "--password", "long enough pw"]

    (data_dir / ".env").write_text(f"# comment\nREDIS_URL={redis_server.url}\n")
    from_make_run = flask_cli(data_dir, *args, ENV_FILE=str(developer))  # no .env: make run's file
    assert from_make_run.returncode == 0, from_make_run.stderr
    assert rdb.exists("user:email:file@example.com")

    (data_dir / ".env").write_text(f"REDIS_URL={dead}\n")
    developer.write_text(f'REDIS_URL="{redis_server.url}"\n')
    rdb.flushall()
    from_developer = flask_cli(data_dir, *args, ENV_FILE=str(developer))
    assert from_developer.returncode == 0, from_developer.stderr
    assert rdb.exists("user:email:file@example.com")

    overridden = flask_cli(data_dir, *args, ENV_FILE=str(developer), REDIS_URL=dead)
    assert overridden.returncode != 0 and f"127.0.0.1:{dead_port} (REDIS_URL)" in overridden.stderr
    assert "Traceback" not in overridden.stderr


def test_a_broken_env_file_stops_the_cli_with_one_sentence_that_holds_none_of_the_line(tmp_path):
    developer = tmp_path / "developer.env"
    developer.write_text("APP_ENV=development\nSMTP_URL smtp://user:secret-password@typo\n")
    result = flask_cli(tmp_path / "var", "users", "list", ENV_FILE=str(developer))
    assert result.returncode != 0
    assert result.stderr.strip() == f"configuration error: {developer}, line 2: expected NAME=value"


#: Everything production needs, in the environment, but SECRET_KEY and PUBLIC_BASE_URL (the tests put those in files).
PRODUCTION = {"APP_ENV": "production", "JWT_SECRET": "j" * 40, "MAIL_ENABLED": "false"}
#: What the tests write into a settings file: production must refuse to start without them, naming both.
FROM_A_FILE = {"SECRET_KEY": "s" * 40, "PUBLIC_BASE_URL": "https://auth.example.test"}


def refused_for_want_of_the_files_settings(result: subprocess.CompletedProcess) -> bool:
    """Whether the CLI stopped with status 4 and one line naming both settings it was given in a file only."""
    lines = result.stderr.strip().splitlines()
    return (
        result.returncode == 4
        and len(lines) == 1
        and lines[0].startswith("configuration error: ")
        and all(f"{name} is missing" in lines[0] for name in FROM_A_FILE)
    )


def test_production_reads_no_env_file(tmp_path, redis_server, rdb):
    """A working tree copied to a server must not bring make run's development defaults (loopback webhooks,
    plain-text mail) into production: with APP_ENV=production in the environment, no file is read."""
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    developer = tmp_path / "developer.env"
    (data_dir / ".env").write_text(f"REDIS_URL={redis_server.url}\nSECRET_KEY={FROM_A_FILE['SECRET_KEY']}\n")
    developer.write_text(f"PUBLIC_BASE_URL={FROM_A_FILE['PUBLIC_BASE_URL']}\n")
    args = ["users", "create", "--email", "prod@example.com", "--password", "long enough pw"]
    developing = flask_cli(data_dir, *args)
    assert developing.returncode == 0, developing.stderr  # the file's Redis: the path reads it
    rdb.flushall()

    production = {**PRODUCTION, "REDIS_URL": redis_server.url, "ENV_FILE": str(developer)}
    from_files = flask_cli(data_dir, *args, **production)
    assert refused_for_want_of_the_files_settings(from_files), from_files.stderr
    assert not rdb.exists("user:email:prod@example.com")
    complete = flask_cli(data_dir, *args, **production, **FROM_A_FILE)  # the same, all in the environment
    assert complete.returncode == 0, complete.stderr
    assert rdb.exists("user:email:prod@example.com")


def test_the_flask_cli_reads_no_env_file_of_its_working_directory(tmp_path, redis_server):
    """`flask` itself loads .env and .flaskenv from the working directory upward before it imports the app:
    in production none of it counts, and a file saying APP_ENV=production stops it. The CLI so reads what
    gunicorn and the delivery process read, in every environment (ENV_FILE chooses the developer's file)."""
    workdir = tmp_path / "release" / "scripts"
    workdir.mkdir(parents=True)
    env_file, flaskenv = tmp_path / "release" / ".env", workdir / ".flaskenv"  # .env found one directory up
    env_file.write_text(f"SECRET_KEY={FROM_A_FILE['SECRET_KEY']}\n")
    flaskenv.write_text(f"PUBLIC_BASE_URL={FROM_A_FILE['PUBLIC_BASE_URL']}\n")

    def cli(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(VENV_BIN / "flask"), "--app", "wsgi", "users", "list"],
            cwd=workdir,
            env=clean_env(PYTHONPATH=str(ROOT), DATA_DIR=str(tmp_path / "var"), REDIS_URL=redis_server.url, **env),
            capture_output=True,
            text=True,
            timeout=60,
        )

    complete = cli(**PRODUCTION, **FROM_A_FILE)  # the setup reaches the app: these two are all it lacks
    assert complete.returncode == 0, complete.stderr
    from_files = cli(**PRODUCTION)
    assert refused_for_want_of_the_files_settings(from_files), from_files.stderr

    # Production said by a file, not by the environment where production's settings come from: refused.
    env_file.write_text("APP_ENV=production\n")
    declared = cli()
    assert declared.returncode == 4, declared.stderr
    assert declared.stderr.strip() == (
        f"configuration error: {env_file}: APP_ENV=production is set in a settings file; production reads "
        "none: set APP_ENV=production, and every other setting, in the environment"
    )
    # In development too the CLI reads only what the other processes read: a value it could not start with
    # in this directory's files changes nothing.
    env_file.write_text("RATE_LIMITS_ENABLED=maybe\n")
    developing = cli(APP_ENV="development")
    assert developing.returncode == 0, developing.stderr


def test_no_settings_file_makes_a_process_a_production_one(tmp_path):
    """APP_ENV=production belongs in the environment, with the rest of production's settings: in the developer's
    .env it stops the CLI, and `make run` (which reads that file through envfiles.py) before it starts anything."""
    developer = tmp_path / "developer.env"
    developer.write_text("APP_ENV=production\n")
    refusal = f"configuration error: {developer}: APP_ENV=production is set in a settings file"
    cli = flask_cli(tmp_path / "var", "users", "list", ENV_FILE=str(developer))
    assert cli.returncode == 4 and cli.stderr.strip().startswith(refusal), cli.stderr
    exports = subprocess.run(
        [str(VENV_BIN / "python"), "envfiles.py"], cwd=ROOT, env=clean_env(ENV_FILE=str(developer)), capture_output=True
    )
    assert exports.returncode == 4 and exports.stderr.decode().startswith(refusal), exports.stderr
    developer.write_text("APP_ENV=test\n")  # any other value is the developer's to choose
    allowed = flask_cli(tmp_path / "var", "routes", ENV_FILE=str(developer))
    assert allowed.returncode == 0 and "/readyz" in allowed.stdout, allowed.stderr


def test_the_readme_says_that_make_run_changes_the_machines_kernel():
    """scripts/run.sh raises two kernel settings of the whole machine when it runs as root: the first step of the
    README says so before anyone types `make run`."""
    script = (ROOT / "scripts" / "run.sh").read_text()
    start_it = (ROOT / "README.md").read_text().split("### 1. Start it", 1)[1].split("\n### ", 1)[0]
    for setting in ("net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog"):
        assert setting in script and f"`{setting}`" in start_it
    assert "whole machine" in start_it and "sysctl -w" in start_it and "sysctl -w" in script


def test_a_copy_of_env_example_changes_nothing(tmp_path):
    """`cp .env.example .env` is the README's first step to keeping settings: as copied, every line is a comment."""
    copy = tmp_path / ".env"
    copy.write_text((ROOT / ".env.example").read_text())
    result = subprocess.run(
        [str(VENV_BIN / "python"), "envfiles.py"], cwd=ROOT, env=clean_env(ENV_FILE=str(copy)), capture_output=True
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    documented = {
        line.removeprefix("# ").partition("=")[0]
        for line in copy.read_text().splitlines()
        if line.startswith("# ") and "=" in line and line[2:].partition("=")[0].isupper()
    }
    assert {"SMTP_URL", "MAILCATCHER_PORT", "MAILCATCHER_WEB_PORT", "WEBHOOK_OUT_ALLOW_HTTP"} <= documented


@pytest.mark.slow
def test_the_delivery_process_reads_the_developers_env_file(tmp_path, redis_server, rdb):
    """`python worker.py` takes its Redis from .env over make run's file, and its log level too."""
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    (data_dir / ".env").write_text(f"REDIS_URL=redis://127.0.0.1:{free_port()}/0\n")
    developer = tmp_path / "developer.env"
    developer.write_text(f"REDIS_URL={redis_server.url}\nLOG_LEVEL=warning\n")
    env = clean_env(APP_ENV="test", DATA_DIR=str(data_dir), ENV_FILE=str(developer))
    del env["LOG_LEVEL"]
    worker = subprocess.Popen(
        [str(VENV_BIN / "python"), "worker.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: list(rdb.scan_iter(match=Keys.outgoing_consumer("*"))), timeout=20, message="heartbeat")
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0].decode()
    assert worker.returncode == 0, output
    assert "delivery process" not in output, output  # its start and stop lines are at info, below warning
