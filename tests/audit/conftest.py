"""Fixtures for the audit log: an administrator, API keys, reading the log, and its JSON lines."""

from __future__ import annotations

import json
import logging

import pytest

from app.auth.users import create_user
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, bearer, random_email


@pytest.fixture
def admin(app, auth):
    """An administrator, signed in (body transport): its tokens, e-mail and id."""
    email = random_email()
    with app.app_context():
        user = create_user(email, DEFAULT_PASSWORD, role="admin", email_verified=True)
    tokens = auth.login_body(email)
    return {**tokens, "email": email, "id": user["id"], "headers": bearer(tokens["access_token"])}


@pytest.fixture
def make_key(client, admin):
    """An API key made by the administrator: its answer (`K` with `key`) and headers that send it."""

    def make(*scopes: str, channels=()):
        body = {"name": "audit test", "scopes": list(scopes), "channels": list(channels)}
        made = client.post("/admin/api-keys", json=body, headers=admin["headers"])
        assert made.status_code == 201, made.get_json()
        return {**made.get_json(), "headers": bearer(made.get_json()["key"])}

    return make


@pytest.fixture
def audit_log(client, admin):
    """Every entry matching the filters, newest first, read page by page through GET /admin/audit."""

    def read(limit: int = 500, **filters) -> list[dict]:
        entries, before = [], None
        while True:
            query = {**filters, "limit": limit, **({"before": before} if before else {})}
            answer = client.get("/admin/audit", query_string=query, headers=admin["headers"])
            assert answer.status_code == 200, answer.get_json()
            entries += answer.get_json()["entries"]
            before = answer.get_json()["next"]
            if before is None:
                return entries

    return read


@pytest.fixture
def audit_lines():
    """The JSON lines the `audit` logger writes during the test, parsed."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("audit")
    logger.addHandler(handler)
    try:
        yield lambda: [json.loads(record.getMessage()) for record in records]
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def app(make_app):
    """The app, allowing webhook endpoints on loopback (no delivery process runs: nothing is sent)."""
    return make_app(WEBHOOK_OUT_ALLOW_PRIVATE="true", WEBHOOK_OUT_ALLOW_HTTP="true")


CLIENT_ADDRESS = "203.0.113.9"


@pytest.fixture
def client(app):
    """A test client whose requests come through the trusted proxy (loopback) from CLIENT_ADDRESS."""
    made = https_client(app)
    made.environ_base["HTTP_X_FORWARDED_FOR"] = CLIENT_ADDRESS
    return made


@pytest.fixture
def recorder(audit_log):
    """What the log gained since the last look: `recorder.new()`, oldest first."""

    class Recorder:
        def __init__(self):
            self.seen = {entry["id"] for entry in audit_log()}

        def new(self, **filters) -> list[dict]:
            fresh = [entry for entry in audit_log(**filters) if entry["id"] not in self.seen]
            self.seen |= {entry["id"] for entry in fresh}
            return list(reversed(fresh))

    return Recorder()
