"""A live service for the client's tests: gunicorn (two gevent workers) on a real Redis, and API keys
made with the operator's CLI, as a deployment would make them."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest

from tests.events.conftest import server  # noqa: F401 - the same two-worker live server as the events tests
from tests.servers import ROOT, VENV_BIN, process_env


@dataclass(frozen=True)
class Keys:
    """API keys for the client under test; each made through `flask --app wsgi api-keys create`."""

    publisher: str  # events:publish to user:* and tokens:introspect
    introspect_only: str  # tokens:introspect, no publishing
    publish_only: str  # events:publish to user:*, no introspection


def create_key(env: dict, name: str, scopes: list[str], channels: list[str]) -> str:
    """A new API key from the CLI, which prints it on its first line."""
    arguments = ["api-keys", "create", "--name", name]
    arguments += [f"--scope={scope}" for scope in scopes] + [f"--channel={channel}" for channel in channels]
    done = subprocess.run(
        [str(VENV_BIN / "flask"), "--app", "wsgi", *arguments],
        cwd=ROOT,
        env=process_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    key = done.stdout.splitlines()[0]
    assert key.startswith("ak_"), done.stdout
    return key


@pytest.fixture(scope="module")
def keys(server, base_env) -> Keys:  # noqa: F811 - pytest passes the imported fixture
    return Keys(
        publisher=create_key(base_env, "billing", ["events:publish", "tokens:introspect"], ["user:*"]),
        introspect_only=create_key(base_env, "gateway", ["tokens:introspect"], []),
        publish_only=create_key(base_env, "mailer", ["events:publish"], ["user:*"]),
    )
