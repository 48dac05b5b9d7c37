"""A live service for the client's tests: gunicorn (two gevent workers) on a real Redis, and API keys
made with the operator's CLI, as a deployment would make them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.conftest import Cli
from tests.events.conftest import server  # noqa: F401 - the same two-worker live server as the events tests


@dataclass(frozen=True)
class Keys:
    """API keys for the client under test; each made through `flask --app wsgi api-keys create`."""

    publisher: str  # events:publish to user:* and tokens:introspect
    introspect_only: str  # tokens:introspect, no publishing
    publish_only: str  # events:publish to user:*, no introspection


def create_key(cli: Cli, name: str, scopes: list[str], channels: list[str]) -> str:
    """A new API key from the CLI, which prints it on its first line."""
    arguments = ["api-keys", "create", "--name", name]
    arguments += [f"--scope={scope}" for scope in scopes] + [f"--channel={channel}" for channel in channels]
    done = cli(*arguments)
    assert done.returncode == 0, done.stderr
    key = done.stdout.splitlines()[0]
    assert key.startswith("ak_"), done.stdout
    return key


@pytest.fixture(scope="module")
def keys(server, module_cli) -> Keys:  # noqa: F811 - pytest passes the imported fixture
    """Made in process (`module_cli`), in the Redis the live server uses: base_env's, never flushed here."""
    return Keys(
        publisher=create_key(module_cli, "billing", ["events:publish", "tokens:introspect"], ["user:*"]),
        introspect_only=create_key(module_cli, "gateway", ["tokens:introspect"], []),
        publish_only=create_key(module_cli, "mailer", ["events:publish"], ["user:*"]),
    )
