"""A `flask` command at a terminal prints its outcome in words; its audit lines go to DATA_DIR/cli-audit.log there,
and to stderr for a log collector otherwise."""

from __future__ import annotations

import json
import os
import pty
import stat
import subprocess
import sys
from pathlib import Path

from tests.servers import ROOT, process_env
from tests.test_settings_and_cli import THE_PROCESS_ITSELF
from tests.utils import random_email

pytestmark = THE_PROCESS_ITSELF


def run_at_a_terminal(base_env, *args: str) -> tuple[str, str]:
    """Run `flask --app wsgi ARGS` with stderr on a pseudo-terminal, as a person runs it: (stdout, terminal)."""
    controller, terminal = pty.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "flask", "--app", "wsgi", *args],
            cwd=ROOT,
            env=process_env(base_env),
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=60,
        )
        os.close(terminal)
        terminal = None
        seen = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end is closed and everything was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if terminal is not None:
            os.close(terminal)
        os.close(controller)
    assert result.returncode == 0, (result.stdout, seen)
    return result.stdout, seen.decode()


def audit_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"logger": "audit"' in line]


def test_help_prints_only_help(base_env):
    out, terminal = run_at_a_terminal(base_env, "users", "create", "--help")
    assert out.startswith("Usage:")
    assert terminal == ""


def test_a_change_at_a_terminal_says_what_it_did_and_logs_its_json_line_beside_which_a_pipe_gets(base_env, rdb):
    email = random_email()
    out, terminal = run_at_a_terminal(base_env, "users", "create", "--email", email, "--password", "a long passphrase")
    assert out.startswith(f"created user {email}")
    assert terminal == ""
    kept = Path(base_env["DATA_DIR"]) / "cli-audit.log"
    [line] = [line for line in audit_lines(kept.read_text()) if line.get("subject") == out.split("(")[1][:32]]
    assert line["type"] == "user.registered" and line["actor"] == {"kind": "cli", "id": None}
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600

    piped = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", "users", "set-role", email, "admin"],
        cwd=ROOT,
        env=process_env(base_env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    assert "admin" in piped.stdout and '"logger"' not in piped.stdout
    [line] = audit_lines(piped.stderr)
    assert line["type"] == "role.changed" and line["actor"] == {"kind": "cli", "id": None}
