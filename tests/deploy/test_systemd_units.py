"""deploy/systemd: the units run the Procfile's lines from the venv, read one environment file, are
restarted, and give each process longer to stop than it takes (docs/operations.md, Processes to run)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import load_settings
from tests.servers import ROOT, process_env

UNITS = ROOT / "deploy" / "systemd"
WEB, WORKER = "auth-rt-web.service", "auth-rt-worker.service"
ENV_EXAMPLE = UNITS / "auth-rt.env.example"
# Where docs/operations.md has the repository checked out; the units name it in WorkingDirectory= and
# ExecStart=, and the repository's own .venv is laid out the same way.
APP_DIR = "/opt/auth-rt"
# DeliveryWorker.run: after SIGTERM, attempts get WEBHOOK_OUT_TIMEOUT_SECONDS plus 5 s, the loops 2 s more.
DELIVERY_STOP_MARGIN = 7
# gunicorn's arbiter kills its workers at GRACEFUL_TIMEOUT, then reaps them and runs its exit hooks.
ARBITER_STOP_MARGIN = 5


def read_unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file of deploy/systemd as systemd reads it."""
    return read_unit_text((UNITS / name).read_text(), name)


def read_unit_text(text: str, name: str = "unit") -> dict[str, dict[str, list[str]]]:
    """A unit file's text as systemd reads it: sections of keys, each with every value given, in order."""
    sections: dict[str, dict[str, list[str]]] = {}
    section = None
    logical = ""
    for raw in text.splitlines():
        line = logical + raw.strip()
        if line.endswith("\\"):  # continued on the next line
            logical = line[:-1] + " "
            continue
        logical = ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None, f"{name}: not a setting: {line!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"{section}/{key}: expected one value, found {values}"
    return values[0]


def procfile() -> dict[str, list[str]]:
    """The Procfile's process types and their command lines, split as a shell would."""
    found = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, command = line.partition(":")
            found[name.strip()] = shlex.split(command)
    return found


def env_example() -> dict[str, str]:
    """The settings the environment file example sets (commented lines are not set)."""
    found = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and name and not name.startswith("#"):
            found[name] = value
    return found


def seconds(span: str) -> float:
    """A systemd time span ("30", "30s", "1min 30s", "2m") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and "".join(f"{n}{u}" for n, u in parts) == span.replace(" ", ""), f"not a time span: {span!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def graceful_timeout(env: dict[str, str]) -> int:
    """gunicorn.conf.py's graceful_timeout under these settings, read by running the file itself."""
    code = "import runpy; print(runpy.run_path('gunicorn.conf.py')['graceful_timeout'])"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=process_env(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(done.stdout.split()[-1])


@pytest.fixture(scope="module")
def units():
    return {name: read_unit(name) for name in (WEB, WORKER)}


@pytest.mark.parametrize("unit, process", [(WEB, "web"), (WORKER, "worker")])
def test_each_unit_runs_its_procfile_line_from_the_venv(units, unit, process):
    command = procfile()[process]
    start = one(units[unit], "Service", "ExecStart")
    assert start[0] not in "@-:+!", f"{unit}: ExecStart= with a prefix ({start[0]}) changes how it runs"
    program, *arguments = shlex.split(start)
    expected = f"{APP_DIR}/.venv/bin/{command[0]}"
    assert (program, arguments) == (expected, command[1:]), (
        f"{unit} runs {start!r}, but the Procfile's {process}: line is {shlex.join(command)!r}: "
        f"ExecStart= should be {shlex.join([expected, *command[1:]])!r}"
    )
    assert (ROOT / ".venv" / "bin" / command[0]).exists(), f"the venv has no {command[0]} (make deps makes it)"
    assert one(units[unit], "Service", "WorkingDirectory") == APP_DIR


def test_the_procfile_says_what_the_public_contract_says():
    lines = procfile()
    assert lines["web"] == ["gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"]
    assert lines["worker"] == ["python", "worker.py"]  # as worker.py's docstring has it run


def test_the_web_unit_only_moves_gunicorn_to_loopback(units):
    """GUNICORN_CMD_ARGS may choose the address nginx reaches, nothing the Procfile's line would not do."""
    service = units[WEB]["Service"]
    arguments = [value for value in service.get("Environment", []) if value.startswith("GUNICORN_CMD_ARGS=")]
    assert arguments == ["GUNICORN_CMD_ARGS=--bind=127.0.0.1:8000"]


def test_both_processes_read_the_same_settings_and_run_as_the_same_user(units):
    files = {name: unit["Service"].get("EnvironmentFile", []) for name, unit in units.items()}
    assert files[WEB] == files[WORKER], f"the two units read different settings: {files}"
    (path,) = files[WEB]
    assert path.startswith("/"), f"{path}: a required absolute file (a leading '-' would start without it)"
    assert path in ENV_EXAMPLE.read_text(), "the example says where it is installed"
    users = {name: (one(unit, "Service", "User"), one(unit, "Service", "Group")) for name, unit in units.items()}
    assert users[WEB] == users[WORKER] and "root" not in users[WEB], users


@pytest.mark.parametrize("unit", [WEB, WORKER])
def test_restarted_and_hardened_without_losing_the_metrics_directory(units, unit):
    service = units[unit]["Service"]
    assert one(units[unit], "Service", "Restart") in {"always", "on-failure", "on-abnormal"}
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes"}.items():
        assert one(units[unit], "Service", key) == value, key
    writable = [f"/var/lib/{path}" for value in service.get("StateDirectory", []) for path in value.split()]
    writable += [path.lstrip("-") for value in service.get("ReadWritePaths", []) for path in value.split()]
    settings = env_example()
    for name in ("DATA_DIR", "PROMETHEUS_MULTIPROC_DIR"):
        directory = Path(settings[name])
        assert any(directory.is_relative_to(path) for path in writable), f"{name}={directory} is read-only in {unit}"


def test_the_web_unit_waits_for_gunicorns_graceful_stop(units):
    settings = env_example()
    graceful = graceful_timeout(
        {"GRACEFUL_TIMEOUT": settings["GRACEFUL_TIMEOUT"]} if "GRACEFUL_TIMEOUT" in settings else {}
    )
    stop = seconds(one(units[WEB], "Service", "TimeoutStopSec"))
    assert stop >= graceful + ARBITER_STOP_MARGIN, (
        f"TimeoutStopSec={stop:g}: systemd would kill gunicorn before its graceful_timeout ({graceful} s) is over"
    )
    # SIGTERM is gunicorn's graceful stop (SIGINT and SIGQUIT cut requests off), to the arbiter alone,
    # which stops its workers itself.
    assert units[WEB]["Service"].get("KillSignal", ["SIGTERM"]) == ["SIGTERM"]
    assert one(units[WEB], "Service", "KillMode") == "mixed"


def test_the_worker_unit_waits_for_attempts_under_way(units, tmp_path):
    settings = env_example()
    environment = {"APP_ENV": "test", "DATA_DIR": str(tmp_path), "SECRET_KEY": "k" * 32, "JWT_SECRET": "j" * 32}
    if "WEBHOOK_OUT_TIMEOUT_SECONDS" in settings:
        environment["WEBHOOK_OUT_TIMEOUT_SECONDS"] = settings["WEBHOOK_OUT_TIMEOUT_SECONDS"]
    attempt = load_settings(environment).outgoing_webhooks.timeout_seconds
    stop = seconds(one(units[WORKER], "Service", "TimeoutStopSec"))
    assert stop > attempt + DELIVERY_STOP_MARGIN, (
        f"TimeoutStopSec={stop:g}: systemd would kill the delivery process while an attempt may still run "
        f"(WEBHOOK_OUT_TIMEOUT_SECONDS={attempt:g}, plus {DELIVERY_STOP_MARGIN} s)"
    )
    assert units[WORKER]["Service"].get("KillSignal", ["SIGTERM"]) == ["SIGTERM"]


def test_the_docs_name_the_directory_the_units_expect():
    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("\n## Processes to run\n", 1)[1].split("\n## ", 1)[0]
    assert f"`{APP_DIR}`" in section or f"**`{APP_DIR}`**" in section
    assert "deploy/systemd/" in section


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_reads_every_line(tmp_path):
    """systemd's own parser: no unknown key, no value it would ignore (those are warnings, not failures)."""
    for name in (WEB, WORKER):
        # Pointed at this checkout, whose venv exists: systemd checks that ExecStart's program does.
        (tmp_path / name).write_text((UNITS / name).read_text().replace(APP_DIR, str(ROOT)))
    done = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / name) for name in (WEB, WORKER))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [line for line in done.stderr.splitlines() if WEB in line or WORKER in line]
    assert done.returncode == 0 and not complaints, done.stderr


INSTALL_UNITS = UNITS / "install-units"


def install_units(unit_dir: Path, *app_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(INSTALL_UNITS), *app_dir],
        env={"PATH": "/usr/bin:/bin", "UNIT_DIR": str(unit_dir)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_install_units_names_the_checkouts_directory_in_one_place(tmp_path):
    """The units say /opt/auth-rt; installed for another checkout, every mention is that checkout's."""
    done = install_units(tmp_path, str(ROOT))
    assert done.returncode == 0, done.stderr
    for name in (WEB, WORKER):
        installed = (tmp_path / name).read_text()
        assert APP_DIR not in installed
        assert installed == (UNITS / name).read_text().replace(APP_DIR, str(ROOT))
        assert oct((tmp_path / name).stat().st_mode & 0o777) == "0o644"
    web = read_unit_text((tmp_path / WEB).read_text())
    assert one(web, "Service", "WorkingDirectory") == str(ROOT)
    assert shlex.split(one(web, "Service", "ExecStart")) == [f"{ROOT}/.venv/bin/gunicorn", *procfile()["web"][1:]]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([WEB, WORKER])  # no .new file left


def test_install_units_defaults_to_the_checkout_it_is_in(tmp_path):
    done = install_units(tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"WorkingDirectory={ROOT}\n" in (tmp_path / WORKER).read_text()


@pytest.mark.parametrize(
    "app_dir, complaint",
    [
        ("auth-rt", "absolute path"),
        ("/srv/auth rt", "letters, digits"),
        ("/srv/a%h", "letters, digits"),
        ("/srv/no-such-checkout", "make -C /srv/no-such-checkout deps"),
    ],
)
def test_install_units_refuses_a_directory_the_units_cannot_run_from(tmp_path, app_dir, complaint):
    done = install_units(tmp_path, app_dir)
    assert done.returncode == 2 and complaint in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "hidden, complaint",
    [("/home", "ProtectHome"), ("/root", "ProtectHome"), ("/tmp", "PrivateTmp")],  # noqa: S108 - the directory refused
)
def test_install_units_refuses_a_checkout_the_hardening_hides_even_through_a_link(tmp_path, hidden, complaint):
    """A checkout whose venv exists, in a directory the service would not see, reached directly, through a
    symbolic link and through `..`: judged where it really is."""
    checkout = Path(hidden) / f"auth-rt-install-test-{tmp_path.name}"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    try:
        (checkout / ".venv" / "bin" / "gunicorn").write_text("#!/bin/sh\n")
        (checkout / ".venv" / "bin" / "gunicorn").chmod(0o755)
        link = tmp_path / "srv-link"
        link.symlink_to(checkout)
        units = tmp_path / "units"
        units.mkdir()
        for given in (str(checkout), str(link), f"/opt/..{checkout}"):
            done = install_units(units, given)
            assert done.returncode == 2 and complaint in done.stderr, (given, done.stderr)
            assert list(units.iterdir()) == []
    finally:
        shutil.rmtree(checkout)
